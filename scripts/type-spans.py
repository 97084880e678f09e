#!/usr/bin/env python3
"""Lines each type spans in a module's sources: its declaration plus every extension of it, in any file.

    scripts/type-spans.py [Sources/DatamodeEngine] [--max N]

Prints the types from the longest down; with --max, exits 1 when one spans more than N lines (issue 25: a
newcomer should be able to hold a type in their head, so no engine type spans more than ~600 lines)."""
import os, re, sys

def spans(directory):
    totals = {}
    decl = re.compile(r'^(?:(?:public|package|internal|private|fileprivate|final)\s+)*(class|struct|enum|extension|actor)\s+([A-Za-z_][\w.]*)')
    for root, _, files in os.walk(directory):
        for name in files:
            if not name.endswith('.swift'):
                continue
            lines = open(os.path.join(root, name), encoding='utf-8').read().split('\n')
            i = 0
            while i < len(lines):
                m = decl.match(lines[i])
                if not m:
                    i += 1
                    continue
                depth, j, opened = 0, i, False
                while j < len(lines):
                    depth += lines[j].count('{') - lines[j].count('}')
                    opened = opened or '{' in lines[j]
                    if opened and depth <= 0:
                        break
                    j += 1
                type_name = m.group(2).split('.')[0]
                totals[type_name] = totals.get(type_name, 0) + (j - i + 1)
                i = j + 1
    return totals

if __name__ == '__main__':
    args = sys.argv[1:]
    limit = None
    if '--max' in args:
        k = args.index('--max')
        limit = int(args[k + 1])
        del args[k:k + 2]
    totals = spans(args[0] if args else 'Sources/DatamodeEngine')
    for type_name, n in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f'{n:6d}  {type_name}')
    over = [t for t, n in totals.items() if limit is not None and n > limit]
    if over:
        print(f'over {limit} lines: {", ".join(sorted(over))}', file=sys.stderr)
        sys.exit(1)
