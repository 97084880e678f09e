#!/usr/bin/env bash
# Generates the man page and the shell completions from the CLI's own definition (swift-argument-parser), so they
# can never disagree with `datamode-proxy --help`:
#   scripts/cli-docs.sh [DIR]     (default .build/cli-docs)
#     DIR/datamode-proxy.1        man page (the GenerateManual plugin): man -l DIR/datamode-proxy.1
#     DIR/datamode-proxy.bash     bash: source it, or copy to /usr/share/bash-completion/completions/datamode-proxy
#     DIR/_datamode-proxy         zsh: a directory on $fpath
#     DIR/datamode-proxy.fish     fish: ~/.config/fish/completions/
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.build/cli-docs}"
mkdir -p "$out"
swift build --product datamode-proxy
bin="$(swift build --show-bin-path)/datamode-proxy"
swift package --allow-writing-to-package-directory generate-manual --configuration debug
cp .build/plugins/GenerateManual/outputs/DatamodeProxyCommand/datamode-proxy.1 "$out/"
"$bin" --generate-completion-script bash > "$out/datamode-proxy.bash"
"$bin" --generate-completion-script zsh > "$out/_datamode-proxy"
"$bin" --generate-completion-script fish > "$out/datamode-proxy.fish"
echo "cli-docs: man page and completions in $out" >&2
