-- Cycles through a list of absolute URLs (one per line in the file given after "--"), each request
-- in absolute form to the proxy whose address is wrk's URL. Second argument: the Host header.
-- Requests are formatted once in init(); request() only picks the next one.
package.path = package.path .. ";" .. (os.getenv("BENCH_LUA_DIR") or ".") .. "/?.lua"
require "common"

local reqs = {}
local n = 0
local i = 0

function init(args)
   wrk.headers["Host"] = args[2]
   local urls = {}
   for url in io.lines(args[1]) do
      if url ~= "" then urls[#urls + 1] = url end
   end
   -- Optional third argument: a number of sessions; request k then names session s<k mod N> (SPEC §12).
   local sessions = tonumber(args[3] or "")
   if sessions then
      local total = math.max(#urls, sessions)
      for k = 0, total - 1 do
         n = n + 1
         reqs[n] = wrk.format("GET", urls[k % #urls + 1], { ["Host"] = args[2], ["Data-Mode-Session"] = "s" .. (k % sessions) })
      end
   else
      for _, url in ipairs(urls) do
         n = n + 1
         reqs[n] = wrk.format("GET", url)
      end
   end
   -- each connection-thread starts at a different offset so the mix is even across connections
   i = math.random(n) - 1
end

function request()
   i = i % n + 1
   return reqs[i]
end
