"""Config values of the right type but the wrong value: every key of the model is
walked, each gets a wrong value, and loading fails with one line naming that key.
The real-process cases check the CLI: exit status 2, one line on stderr, and it
never says it is listening."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing

import pytest
import yaml

from vlm_gateway import ConfigError, GatewayConfig, load_config

SHA = "ab" * 32
# the smallest valid entry of each list of sections, for setting one key inside it
ENTRY = {"backends": {"url": "http://gpu1:8000/v1"}, "auth.tenants": {"name": "t", "key_sha256": SHA},
         "discovery": {"kind": "dns", "dns_name": "vllm.example.internal", "port": 8000}}

# key -> a wrong value of the right type (the error must name this key)
BAD: dict[str, typing.Any] = {
    "server.host": "http://0.0.0.0:8080",
    "server.port": 70000,
    "server.workers": 0,
    "server.pid_dir": "/proc/version/run",
    "server.max_body_bytes": 0,
    "server.keepalive_interval_s": 0,
    "server.log_level": "verbose",
    "server.log_format": "xml",
    "server.allowed_hosts": ["https://gw.example.com/"],
    "server.allowed_origins": ["app.example.com"],
    "server.header_timeout_s": 0,
    "server.max_header_bytes": 100,
    "server.body_timeout_s": -1,
    "server.body_min_bytes_per_s": -5,
    "server.max_connections": 3,
    "server.keep_alive_timeout_s": 0,
    "server.send_timeout_s": 0,
    "upstream.connect_timeout_s": 0,
    "upstream.read_timeout_s": -1,
    "upstream.total_timeout_s": 0,
    "upstream.max_connections": 0,
    "upstream.max_response_bytes": 10,
    "upstream.max_sse_event_bytes": 10,
    "backends[].url": "gpu1:8000",
    "backends[].name": "bad\r\nname",
    "backends[].api_key": "sk-abc\ninjected: header",
    "backends[].models": [""],
    "backends[].engine": "tgi",
    "backends[].profile": "nope",
    "backends[].metrics_url": "gpu1:8000/metrics",
    "routing.policy": "fastest",
    "routing.max_retries": -1,
    "routing.health_interval_s": 0,
    "routing.scrape_interval_s": 0,
    "routing.eject_after_failures": 0,
    "routing.eject_base_s": 0,
    "routing.eject_max_s": 0.5,  # below eject_base_s (1.0)
    "routing.queue_timeout_s": -1,
    "routing.max_queue": -1,
    "routing.affinity_max_load": 0,
    "routing.affinity_max_extra_seqs": -1,
    "routing.affinity_min_match": 1.5,
    "routing.affinity_ttl_s": 0,
    "routing.affinity_max_entries": 0,
    "images.max_long_side": 16,  # below grid_factor (32)
    "images.grid_factor": 0,
    "images.min_pixels": 0,
    "images.max_pixels": 1000,  # below min_pixels
    "images.detail_low_long_side": 8,
    "images.detail_high_long_side": 8,
    "images.url_mode": "maybe",
    "images.allow_networks": ["10.0.0.0/33"],
    "images.allow_domains": ["https://cdn.example.com/img"],
    "images.deny_domains": ["bad domain"],
    "images.fetch_timeout_s": 0,
    "images.max_fetch_bytes": 0,
    "images.max_redirects": -1,
    "images.max_source_pixels": 0,
    "images.trim_tolerance": 300,
    "images.jpeg_quality": 101,
    "images.resample": "nearest",
    "images.prescale_gap": 0.5,
    "images.url_cache_ttl_s": -1,
    "images.l1_max_bytes": -1,
    "images.l1_redis_ttl_s": 0,
    "images.pool_workers": -1,
    "images.max_queue": -1,
    "images.max_queue_wait_ms": -1,
    "images.max_threads_per_image": 0,
    "images.max_coordinate_groups": 0,
    "images.models": {"qwen": {"max_long_sidee": 512}},
    "images.budget": "smart",
    "images.text_max_long_side": 16,  # below grid_factor (32)
    "images.legible_text_px": 0,
    "images.legible_dense_px": 100,
    "images.photo_long_side": 8,
    "cache.mode": "sometimes",
    "cache.ttl_s": 0,
    "cache.max_bytes": -1,
    "cache.max_entry_bytes": 0,
    "cache.semantic_threshold": 0.5,
    "cache.semantic_max_entries_per_partition": 0,
    "cache.redis_timeout_s": 0,
    "cache.redis_retry_s": -1,
    "cache.semantic_max_entries": 0,
    "cache.semantic_hnsw_above": 0,
    "cache.semantic_model_dir": "/nonexistent/minilm",
    "cache.semantic_max_queue": 0,
    "auth.tenants[].name": "team{a}",
    "auth.tenants[].key_sha256": "sk-plain-key-pasted-here",
    "auth.tenants[].models": [""],
    "auth.tenants[].requests_per_minute": -1,
    "auth.tenants[].concurrent_streams": -1,
    "auth.tenants[].images_per_minute": -1,
    "auth.tenants[].visual_tokens_per_minute": -1,
    "auth.tenants[].max_tokens_cap": -1,
    "auth.tenants[].cache_scope": "scope\x01",
    "auth.tenants[].images": {"budget": "smart"},
    "auth.admin_key_sha256": "admin",
    "limits.max_messages": 0,
    "limits.max_images_per_request": -1,
    "limits.max_total_image_bytes": -1,
    "limits.max_tokens_cap": -1,
    "limits.max_videos_per_request": -1,
    "limits.max_audios_per_request": -1,
    "limits.max_video_bytes": -1,
    "limits.max_audio_bytes": -1,
    "limits.max_total_video_bytes": -1,
    "limits.max_total_audio_bytes": -1,
    "limits.max_media_bytes_in_flight": -1,
    "images.max_decode_bytes": -1,
    "images.max_decode_bytes_large": -1,
    "images.max_decode_bytes_per_source_byte": -1,
    "images.max_decode_bytes_in_flight": -1,
    "backends[].metrics_format": "json",
    "images.coordinates": "qwen4",
    "discovery[].kind": "consul",
    "discovery[].dns_name": "not a name!",
    "discovery[].port": 70000,
    "discovery[].interval_s": 0,
    "discovery[].nameservers": ["10.0.0.1:99999"],
    "discovery[].address_family": "ipv5",
    "discovery[].service": "Bad_Service",
    "discovery[].namespace": "Bad_NS",
    "discovery[].port_name": "a-port-name-too-long",
    "discovery[].kubeconfig": "/nonexistent/kubeconfig",
    "discovery[].scheme": "ftp",
    "discovery[].path": "v1",
    "discovery[].engine": "tgi",
    "discovery[].profile": "nope",
    "discovery[].models": [""],
    "discovery[].api_key": "key\nwith newline",
    "discovery[].metrics_format": "json",
    "discovery[].drain_timeout_s": -1,
    "video.fps": 0,
    "video.max_frames": 1,
    "video.min_fps": 0,
    "video.dedupe_pixel_delta": 300,
    "video.dedupe_changed_fraction": 1.5,
    "video.plan": "best",
    "video.max_long_side": 16,
    "video.crf": 60,
    "video.max_duration_s": 0,
    "video.max_source_frames": 0,
    "video.max_frame_pixels": 0,
    "video.max_decoded_pixels": 0,
    "video.max_decode_s": 0,
    "video.pool_workers": -1,
    "video.decode_threads": -1,
    "video.max_queue": -1,
    "video.l1_max_bytes": -1,
    "video.l1_redis_ttl_s": -1,
    "video.tokenizer": "/nonexistent/tokenizer.json",
    "video.engine_fps": 0,
    "video.engine_max_frames": 0,
    "video.engine_max_pixels": 0,
    "video.engine_min_pixels": 0,
    "simulator.profile": "nope",
    "simulator.time_scale": 0,
    "simulator.port": 70000,
    "slo.ttft_ms": 0,
    "slo.percentile": "p50",
    "slo.window_s": 0,
    "slo.min_samples": 0,
    "slo.interval_s": 0,
    "slo.down_at": 0,
    "slo.early_at": 0,
    "slo.kv_high": 1.5,
    "slo.down_hold_s": -1,
    "slo.up_at": 0,
    "slo.up_hold_s": 0,
    "slo.up_hold_max_s": 0,
    "slo.photo_scales": [0.8, 0.9],
    "slo.text_scales": [1.0, 0.0],
    "slo.photo_floor_long_side": 0,
    "profiles": {"mine": {"engine": "tgi"}},
    "redis_url": "localhost:6379",
    "redis_prefix": "a:b",
}
# keys whose every value of the right type is valid
NO_WRONG_VALUE = {"server.ui", "images.enabled", "images.allow_private_networks", "images.trim_borders",
                  "cache.enabled", "cache.normalized", "cache.semantic", "cache.client_control",
                  "cache.semantic_guard", "images.allow_image_embeds", "images.map_coordinates",
                  "auth.tenants[].map_coordinates", "limits.allow_media_kwargs", "discovery[].read_pods",
                  "video.enabled", "video.dedupe", "slo.enabled", "auth.tenants[].images_below_floor"}


def model_keys(cls: type = GatewayConfig, path: str = "") -> list[str]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{path}.{f.name}" if path else f.name
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if dataclasses.is_dataclass(tp):
            out += model_keys(tp, key)
        elif origin is list and args and dataclasses.is_dataclass(args[0]):
            out += model_keys(args[0], key + "[]")
        else:
            out.append(key)
    return out


def config_with(key: str, value) -> tuple[dict, str]:
    """YAML data setting ``key`` (inside a minimal list entry where needed) and the
    key as the error must name it."""
    if "[]." in key:
        section, leaf = key.split("[].")
        entry = {**ENTRY[section], leaf: value}
        node: dict = {}
        data = node
        parts = section.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = [entry]
        return data, f"{section}[0].{leaf}"
    data: dict = {}
    node = data
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return data, key


def test_every_key_of_the_model_has_a_wrong_value_here():
    keys = set(model_keys())
    missing = keys - set(BAD) - NO_WRONG_VALUE
    assert not missing, f"add a wrong value for {sorted(missing)} to BAD (and a rule in config_values.py)"
    assert not (set(BAD) | NO_WRONG_VALUE) - keys, "keys listed here that the model no longer has"


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_wrong_value_names_its_key(tmp_path, key):
    data, named = config_with(key, BAD[key])
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(str(path), environ={})
    assert str(e.value).startswith(named + ":") or str(e.value).startswith(named + "."), str(e.value)
    assert "\n" not in str(e.value)


def test_the_valid_side_of_each_rule_loads(tmp_path):
    """Examples that must keep loading (the rules are not stricter than they should be)."""
    data = {
        "server": {"host": "0.0.0.0", "allowed_hosts": ["gw.example.com", "*.internal.example.com", "10.1.2.3", "*"],
                   "allowed_origins": ["https://app.example.com", "http://127.0.0.1:3000", "*"]},
        "backends": [{"url": "http://gpu1:8000/v1", "name": "gpu-1", "profile": "h200", "api_key": "sk-x"},
                     {"url": "https://[fd00::1]:8443", "metrics_url": "http://gpu2:9000/metrics"}],
        "images": {"allow_networks": ["10.0.0.0/8", "fd00::/8", "192.168.1.5"],
                   "allow_domains": ["example.com", "*.cdn.example.com", ".img.example.org"],
                   "models": {"qwen2": {"grid_factor": 28, "max_long_side": 784}}},
        "redis_url": "rediss://:secret@redis.internal:6380/2", "redis_prefix": "team-a.prod",
        "simulator": {"profile": "fast"}, "routing": {"policy": "least_loaded"},
        "profiles": {"mine": {"base": "h200", "max_num_seqs": 8}},
    }
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(str(path), environ={})
    assert cfg.images.models["qwen2"]["grid_factor"] == 28
    data["backends"][1]["profile"] = "mine"  # a profile defined in the same file
    path.write_text(yaml.safe_dump(data))
    load_config(str(path), environ={})
    for url in ("unix:///run/redis.sock", "redis://127.0.0.1:6379/0", "redis://localhost"):
        assert load_config(None, environ={"VLM_GATEWAY_REDIS_URL": url}).redis_url == url


def _serve(tmp_path, text: str | None = None, env: dict | None = None, args: tuple = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "vlm_gateway", "serve", "--port", "1", *args]
    if text is not None:
        p = tmp_path / "c.yaml"
        p.write_text(text)
        cmd += ["--config", str(p)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("text,key", [
    ("routing: {policy: fastest}", "routing.policy"),
    ("redis_url: localhost:6379", "redis_url"),
    ("server: {log_level: verbose}", "server.log_level"),
    ("simulator: {profile: nope}", "simulator.profile"),
    ("slo: {up_at: 0.95}", "slo.up_at"),
    ("slo: {photo_scales: [0.8, 0.6, 0.5]}", "slo.text_scales"),
    ("slo: {up_hold_s: 90}", "slo.up_hold_max_s"),
    ("backends: [{url: 'http://127.0.0.1:9/v1', profile: nope}]", "backends[0].profile"),
    ("images: {allow_networks: [not-a-network]}", "images.allow_networks"),
    ("server: {host: 'localhost:8080'}", "server.host"),
    ("cache: {semantic: true, semantic_model_dir: /nonexistent}", "cache.semantic_model_dir"),
    ("backends: [{url: 'http://a:1/v1', name: x}, {url: 'http://b:1/v1', name: x}]", "backends[1].name"),
])
def test_cli_refuses_before_listening_with_one_line(tmp_path, text, key):
    r = _serve(tmp_path, text)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert "listening" not in r.stdout + r.stderr


def test_cli_checks_environment_values_and_backend_flags_too(tmp_path):
    r = _serve(tmp_path, env={"VLM_GATEWAY_ROUTING__POLICY": "fastest"})
    assert r.returncode == 2 and "routing.policy" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _serve(tmp_path, args=("--backend", "gpu1:8000"))
    assert r.returncode == 2 and "--backend" in r.stderr
    r = _serve(tmp_path, "backends: [{url: 'http://127.0.0.1:9/v1'}]", args=("--backend", "http://127.0.0.1:9/v1"))
    assert r.returncode == 2 and "backends[1].name" in r.stderr


def test_several_workers_without_redis_refuse_per_tenant_limits(tmp_path):
    """Each worker would keep its own buckets: 2 workers would admit twice the limit."""
    tenants = f"auth: {{tenants: [{{name: a, key_sha256: '{SHA}', requests_per_minute: 10}}]}}\n"
    r = _serve(tmp_path, "server: {workers: 2}\n" + tenants)
    assert r.returncode == 2 and "server.workers" in r.stderr and "redis_url" in r.stderr, r.stderr
    # with Redis the limits are shared, and without limits there is nothing to multiply
    load_config(None, environ={}, overrides={"server": {"workers": 2}, "redis_url": "redis://127.0.0.1:6379/0",
                                             **yaml.safe_load(tenants)})
    load_config(None, environ={}, overrides={"server": {"workers": 2},
                                             "auth": {"tenants": [{"name": "a", "key_sha256": SHA}]}})
