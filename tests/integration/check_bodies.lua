-- wrk script: checks every response, not just counts them.  A response is
-- good when its status is 200 and its body is exactly one of the allowed
-- bodies (files named on the command line); done() writes the tallies, with
-- wrk's own error counts, to OUT as "name value" lines, and each thread
-- keeps its first bad bodies in OUT.bad-THREAD-N for the failure message.
--
--   wrk -s check_bodies.lua URL -- OUT ALLOWED_FILE...
--
-- Tallies: requests, good, bad, allowed_N (responses equal to the Nth
-- allowed file, from 1), status_CODE, errors_connect/read/write/status/
-- timeout.

local threads = {}

function setup(thread)
   thread:set("id", #threads + 1)
   table.insert(threads, thread)
end

function init(args)
   out = args[1]
   allowed = {}
   nallowed = #args - 1
   for i = 2, #args do
      local f = assert(io.open(args[i], "rb"))
      allowed[f:read("*a")] = i - 1
      f:close()
   end
   good = 0
   bad = 0
   kept = 0
   -- Per allowed body and per status: "key=count" pairs, joined in done().
   hits = {}
   statuses = {}
end

local function keep(status, body)
   if kept >= 3 then
      return
   end
   kept = kept + 1
   local f = io.open(string.format("%s.bad-%d-%d", out, id, kept), "wb")
   if f then
      f:write(string.format("status %d, %d bytes\n", status, #body), body)
      f:close()
   end
end

local function tally(t)
   local parts = {}
   for k, v in pairs(t) do
      table.insert(parts, k .. "=" .. v)
   end
   return table.concat(parts, " ")
end

function response(status, headers, body)
   statuses[status] = (statuses[status] or 0) + 1
   local which = allowed[body]
   if status == 200 and which then
      good = good + 1
      hits[which] = (hits[which] or 0) + 1
   else
      bad = bad + 1
      keep(status, body)
   end
   -- thread:get() copies strings and numbers only.
   hit_tally = tally(hits)
   status_tally = tally(statuses)
end

function done(summary, latency, requests)
   local sums = {good = 0, bad = 0}
   local function add(name, n)
      sums[name] = (sums[name] or 0) + n
   end
   for _, t in ipairs(threads) do
      add("good", t:get("good") or 0)
      add("bad", t:get("bad") or 0)
      for k, v in string.gmatch(t:get("hit_tally") or "", "(%d+)=(%d+)") do
         add("allowed_" .. k, tonumber(v))
      end
      for k, v in string.gmatch(t:get("status_tally") or "", "(%d+)=(%d+)") do
         add("status_" .. k, tonumber(v))
      end
   end
   local f = assert(io.open(threads[1]:get("out"), "w"))
   f:write("requests ", summary.requests, "\n")
   for _, e in ipairs({"connect", "read", "write", "status", "timeout"}) do
      f:write("errors_", e, " ", summary.errors[e], "\n")
   end
   for k, v in pairs(sums) do
      f:write(k, " ", v, "\n")
   end
   f:close()
end
