-- wrk script for bench/compare.py: GET $BENCH_PATH?user=u<k> (or $BENCH_PATH u<k>) with k uniform
-- over 10,000 users, on keep-alive connections (or one per request). The requests are formatted
-- once in init (wrk.format), so a request costs one table lookup.
-- done() prints one machine-readable RESULT line.

local path = os.getenv("BENCH_PATH") or "/bytes/200"
local users = tonumber(os.getenv("BENCH_USERS") or "10000")
-- BENCH_CLOSE=1: every request asks for `Connection: close`, so each one
-- opens a new connection (a new TLS handshake over HTTPS).
local close = os.getenv("BENCH_CLOSE") == "1"
-- BENCH_KEY_IN_PATH=1: GET $BENCH_PATH u<k> (the key in the path: the
-- key-value store's /kv/u<k>) instead of the user query parameter.
local in_path = os.getenv("BENCH_KEY_IN_PATH") == "1"
local reqs = {}

function init(args)
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
  for k = 1, users do
    local headers = close and { ["Connection"] = "close" } or nil
    local target = in_path and (path .. "u" .. k) or (path .. "?user=u" .. k)
    reqs[k] = wrk.format("GET", target, headers)
  end
end

function request()
  return reqs[math.random(users)]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d bytes=%d p50=%d p99=%d p999=%d max=%d " ..
    "connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end

-- BENCH_DELAY_MS: think time per connection between a response and the
-- next request, for a fixed moderate load instead of saturation.
local think = tonumber(os.getenv("BENCH_DELAY_MS") or "0")
if think > 0 then
  function delay()
    return think
  end
end
