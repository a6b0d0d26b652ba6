"""Environments as network services: `corral serve-env` and `cr.remote`.

`serve` builds and runs the server (`app`: HTTP + WebSocket session protocols, `openenv`:
OpenEnv's protocol), `sessions` owns the env
instances, `ops` is what a session can do, `protocol` the wire format both sides share;
`client` (`RemoteEnv`, `remote`), `connection` and `fleet` (several servers) are the client.
"""
