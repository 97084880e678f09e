-- One fixed request in absolute form (GET http://origin/path HTTP/1.1), sent to the proxy whose
-- address is wrk's URL. Arguments after "--": the absolute URL, the Host header.
-- Without arguments (direct to origin) wrk's own origin-form request is used.
package.path = package.path .. ";" .. (os.getenv("BENCH_LUA_DIR") or ".") .. "/?.lua"
require "common"

function init(args)
   if args[1] then
      wrk.path = args[1]
      wrk.headers["Host"] = args[2]
   end
end
