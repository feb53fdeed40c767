"""``vlm-gateway`` command line: serve, sim, launch, hash-key."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import sys
import tempfile

import orjson

from . import __version__, load_config, validate
from .config import BackendConfig, ConfigError
from .config_values import http_url

log = logging.getLogger("vlm_gateway")


def _setup_logging(level: str, fmt: str) -> None:
    from .logs import setup_logging
    setup_logging(level, fmt)


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _connection_limit(configured: int) -> int:
    """Raise the descriptor limit for the connection cap (workers inherit it); the cap.
    An explicit cap the limit cannot hold is a config error."""
    from .proxy.connection_guard import connection_cap, fds_needed, raise_fd_limit
    if configured:
        need = fds_needed(configured)
        have = raise_fd_limit(need)
        if have < need:
            raise ConfigError(f"server.max_connections: {configured} connections need about {need} file "
                              f"descriptors per worker, the limit is {have} (ulimit -n); raise the limit, "
                              "lower the cap, or set 0 for a cap derived from the limit")
        return configured
    return connection_cap(0, raise_fd_limit(1 << 17))


def cmd_serve(args: argparse.Namespace) -> int:
    # Checking the config imports the metrics module here; with several workers this process
    # only supervises, and must not write Prometheus multi-process files of its own (a
    # directory given in the environment is read when prometheus_client is imported): the
    # directory goes back into the environment just before the workers are started.
    multiproc_dir = os.environ.pop("PROMETHEUS_MULTIPROC_DIR", "")
    overrides: dict = {}
    server = {k: v for k, v in (("host", args.host), ("port", args.port), ("workers", args.workers),
                                ("log_format", args.log_format)) if v is not None}
    if server:
        overrides["server"] = server
    try:
        cfg = load_config(args.config, overrides=overrides)
        for url in args.backend or ():
            problem = http_url(url, cfg)
            if problem:
                raise ConfigError(f"--backend: {problem}")
            cfg.backends.append(BackendConfig(url=url, engine="openai"))
        if args.backend:
            validate(cfg)  # names must stay unique with the added backends
    except ConfigError as e:
        print(f"vlm-gateway: config error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    try:
        cap = _connection_limit(cfg.server.max_connections)
    except ConfigError as e:
        print(f"vlm-gateway: config error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    host, port = cfg.server.host, cfg.server.port
    if args.check:  # the whole configuration checked, nothing started
        where = ", ".join(b.url for b in cfg.backends) or ("discovery" if cfg.discovery else "the built-in simulator")
        print(f"vlm-gateway: config OK: would listen on {host}:{port} ({cfg.server.workers} worker"
              f"{'s' if cfg.server.workers > 1 else ''}) in front of {where}")
        return 0
    _setup_logging(cfg.server.log_level, cfg.server.log_format)
    try:
        # bound before anything is started or logged: a port in use is one line, not a traceback
        sock = _bind(host, port, keep=cfg.server.workers == 1)
    except OSError as e:
        print(f"vlm-gateway: server.port: cannot listen on {host}:{port} ({e.strerror or e}); "
              "choose another with --port or server.port", file=sys.stderr)
        return 2
    if not cfg.backends and not cfg.discovery:
        from .backends.sim.embedded import start_in_thread
        from .backends.sim.profiles import get_profile
        prof = get_profile(cfg.simulator.profile, time_scale=cfg.simulator.time_scale)
        try:
            url = start_in_thread(prof, cfg.simulator.port)
        except OSError as e:
            print(f"vlm-gateway: simulator.port: cannot listen on 127.0.0.1:{cfg.simulator.port} "
                  f"({e.strerror or e}); choose another or 0 for a free one", file=sys.stderr)
            return 2
        cfg.backends.append(BackendConfig(url=url, name="simulator", engine="sim"))
        banner = "!" * 78
        log.warning("%s", banner)
        log.warning("NO BACKEND CONFIGURED: serving the built-in SIMULATOR (profile %s) at %s.", prof.name, url)
        log.warning("It is a test instrument that generates filler text, NOT a model.")
        log.warning("Add backends with --backend URL or a config file to serve a real engine.")
        log.warning("%s", banner)
    if host not in ("127.0.0.1", "localhost", "::1") and not cfg.auth.tenants:
        log.warning("listening on %s without API keys: anyone who can reach it can use the backends", host)
    import uvicorn
    os.environ["VLM_GATEWAY_CONFIG_JSON"] = orjson.dumps(cfg.to_dict()).decode()
    if cfg.server.workers > 1:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir or tempfile.mkdtemp(prefix="vlm-gateway-metrics-")
    where = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    # uvicorn's httptools protocol plus header/body deadlines and the connection cap
    kwargs = dict(app="vlm_gateway.proxy.app:create_app", factory=True, host=host, port=port,
                  log_level="warning", access_log=False, loop="uvloop",
                  http="vlm_gateway.proxy.connection_guard:GuardedHttpToolsProtocol", ws="none",
                  timeout_graceful_shutdown=5, timeout_keep_alive=cfg.server.keep_alive_timeout_s)
    if cfg.server.workers > 1:
        from .proxy.workers import Supervisor
        sup = Supervisor(cfg.server.workers, kwargs, cfg.server.pid_dir)
        try:
            sup.bind()  # the supervisor's own hold on the address, before it says it listens
        except OSError as e:
            print(f"vlm-gateway: server.port: cannot listen on {host}:{port} ({e.strerror or e}); "
                  "choose another with --port or server.port", file=sys.stderr)
            return 2
        _log_listening(where, cfg, cap)
        rc = sup.run()
        log.info("vlm-gateway stopped (%s)", where)
        return rc
    pid_file = os.path.join(cfg.server.pid_dir, "gateway.pid") if cfg.server.pid_dir else ""
    if pid_file:
        os.makedirs(cfg.server.pid_dir, exist_ok=True)
        with open(pid_file, "w") as f:
            f.write(f"{os.getpid()}\n")
    _log_listening(where, cfg, cap)
    try:
        _server(uvicorn.Config(**kwargs), where).run(sockets=[sock])
    finally:
        if pid_file:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pid_file)
    return 0


def _bind(host: str, port: int, keep: bool):
    """Bind ``host:port`` (a plain socket: an address anyone holds, with or without
    SO_REUSEPORT, is refused). ``keep``: return it for uvicorn; else close it (the workers
    bind their own) and return None."""
    import socket
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    if not keep:
        sock.close()
        return None
    sock.set_inheritable(False)
    return sock


def _log_listening(where: str, cfg, cap: int) -> None:
    n, b = cfg.server.workers, len(cfg.backends)
    log.info("vlm-gateway %s listening on %s (%d worker%s, %d backend%s, up to %d client connections "
             "per worker)", __version__, where, n, "s" if n > 1 else "", b, "s" if b > 1 else "", cap)
    if cfg.discovery:
        log.info("backend discovery: %s", ", ".join(f"{d.kind} {d.dns_name or d.service}" for d in cfg.discovery))


def _server(config, where: str):
    """uvicorn's server, saying when a signal starts the shutdown and when it is done
    (uvicorn then re-raises the signal: the exit status is the signal's)."""
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                log.info("shutting down (%s): finishing requests in flight, at most %d s",
                         signal.Signals(sig).name, self.config.timeout_graceful_shutdown or 0)
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None) -> None:
            await super().shutdown(sockets)
            log.info("vlm-gateway stopped (%s)", where)
    return Server(config)


def cmd_sim(args: argparse.Namespace) -> int:
    from .backends.sim import SimEngine, create_sim_app
    from .backends.sim.profiles import get_profile
    _setup_logging("info", "text")
    try:
        prof = get_profile(args.profile, time_scale=args.time_scale, decode_tokens_per_s=args.token_rate,
                           max_num_seqs=getattr(args, "max_num_seqs", None),
                           api_servers=getattr(args, "api_servers", None))
    except (KeyError, ValueError) as e:
        print(f"vlm-gateway sim: {e.args[0]}", file=sys.stderr)
        return 2
    engine = args.engine if args.engine == "vllm" else f"{args.engine} {args.trtllm_release}"
    log.warning("vlm-gateway SIMULATOR (test instrument, generates filler text), profile %s, engine %s, "
                "model %s, %d API server%s, on http://%s:%d", prof.name, engine, args.model, prof.api_servers,
                "s" if prof.api_servers > 1 else "", args.host, args.port)
    app = create_sim_app(SimEngine(prof, engine=args.engine, trtllm_release=args.trtllm_release), args.model,
                         echo=args.echo, grounding=args.grounding or "")
    from .backends.sim.serve import serve
    serve(app, args.host, args.port)   # uvicorn, plus the refuse_connections fault
    return 0


def cmd_hash_key(args: argparse.Namespace) -> int:
    key = args.key
    if key is None:  # read it, so it stays out of the shell history
        import getpass
        key = getpass.getpass("API key: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not key:
        print("vlm-gateway hash-key: empty key", file=sys.stderr)
        return 2
    print(hashlib.sha256(key.encode()).hexdigest())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vlm-gateway", description="OpenAI-compatible gateway for VLM servers")
    p.add_argument("--version", action="version", version=f"vlm-gateway {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="run the gateway",
                       description="Run the OpenAI-compatible gateway. Every option overrides the config file "
                                   "and VLM_GATEWAY_* variables (docs/CONFIG.md); with no backend configured the "
                                   "built-in simulator (a test instrument) is started as the backend.")
    s.add_argument("--config", metavar="FILE",
                   help="YAML config file (see examples/gateway.yaml); default: $VLM_GATEWAY_CONFIG, else none")
    s.add_argument("--host", help="address to listen on (server.host, default 127.0.0.1); anything but "
                                  "loopback without API keys (auth.tenants) logs a warning")
    s.add_argument("--port", type=int, help="TCP port to listen on (server.port, default 8080)")
    s.add_argument("--backend", action="append", metavar="URL",
                   help="OpenAI-compatible upstream, e.g. http://gpu1:8000/v1 (repeatable; added to the "
                        "config's backends; a config file's backends[] also sets engine, profile and name)")
    s.add_argument("--workers", type=int, metavar="N",
                   help="worker processes, each with its own listening socket (server.workers, default 1)")
    s.add_argument("--log-format", choices=["text", "json"],
                   help="log lines as text or one JSON object per line (server.log_format, default text)")
    s.add_argument("--check", action="store_true",
                   help="check the configuration (file, VLM_GATEWAY_* variables, these options) and exit: "
                        "0 and one line when it is valid, 2 and the key at fault when not; listens on nothing")
    s.set_defaults(func=cmd_serve)

    m = sub.add_parser("sim", help="run the vLLM-like simulator (a test instrument)")
    m.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    m.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    m.add_argument("--profile", default="h200-qwen3vl-2b", help="timing profile (backends/sim/profiles.yaml)")
    m.add_argument("--model", default="qwen3vl-sim", help="served model name")
    m.add_argument("--engine", choices=["vllm", "trtllm"], default="vllm",
                   help="load endpoints to serve: vLLM's /metrics, or trtllm-serve's /metrics (JSON iteration "
                        "statistics) and /prometheus/metrics")
    m.add_argument("--trtllm-release", choices=["1.2", "1.3"], default="1.2",
                   help="with --engine trtllm: 1.2 = the stable line (Prometheus: request series only), "
                        "1.3 = pre-releases with the iteration gauges (trtllm_num_requests_running, ...)")
    m.add_argument("--time-scale", type=float, default=1.0, help="0.1 = ten times faster than real time")
    m.add_argument("--token-rate", type=float, default=None, help="decode tokens/s of one sequence")
    m.add_argument("--echo", action="store_true", help="answer with the last user text, then filler")
    m.add_argument("--max-num-seqs", type=int, default=None, help="override the profile's concurrent sequences")
    m.add_argument("--api-servers", type=int, default=None,
                   help="API-server processes, as vLLM's --api-server-count (each preprocesses on one worker "
                        "with its own processor cache); default: the profile's (1)")
    m.add_argument("--grounding", choices=["qwen3-vl", "qwen2.5-vl", "qwen2-vl"], default=None,
                   help="answer requests with images like a perfect locator of colour markers, in this "
                        "model's coordinate convention (a test instrument)")
    m.set_defaults(func=cmd_sim)

    h = sub.add_parser("hash-key", help="print the sha256 of an API key for auth.tenants[].key_sha256")
    h.add_argument("key", nargs="?", help="the key; omit it to type it or pipe it on stdin")
    h.set_defaults(func=cmd_hash_key)

    from .backends.launch import add_parser as add_launch
    add_launch(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
