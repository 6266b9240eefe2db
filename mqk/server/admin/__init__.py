"""The admin front door: one HTTP listener for operators (metrics, health, the web console).

- `http`: the HTTP/1.1 server (h11 under asyncio) and its routing;
- `server.AdminServer`: the listener with its routes;
- `metrics`: /metrics, built from the broker's counters and state when scraped (prometheus-client);
- `health`: /health/live and /health/ready;
- `console`: the web console (/console/, its pages in static/) and the JSON API it reads (/api/...);
- `parts.BrokerParts`: what of the running broker these read (the runtime provides it).
"""
