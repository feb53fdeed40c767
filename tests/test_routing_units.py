"""Routing pieces on their own: profiles, launch command lines, metric scraping,
prefix keys, the profile filter, the load formula and the policies' choices."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import replace
from pathlib import Path

import pytest

from vlm_gateway.backends.admission import ProfileFilter, text_tokens
from vlm_gateway.backends.backend import Backend
from vlm_gateway.backends.launch import command_for, trtllm_options
from vlm_gateway.backends.profiles import get_profile, load_profiles
from vlm_gateway.backends.router import get_policy, policy_names
from vlm_gateway.backends.router.affinity import PrefixMap, prefix_keys
from vlm_gateway.backends.router.least_loaded import load
from vlm_gateway.backends.scrape import extract, parse
from vlm_gateway.backends.sim.prompt import build_prompt
from vlm_gateway.backends.stats import EngineStats
from vlm_gateway.config import ConfigError, GatewayConfig, RoutingConfig, TenantConfig
from vlm_gateway.core.request import parse_chat
from vlm_gateway.stages.auth import TENANT
from vlm_gateway.vision_tokens import estimate_prompt_tokens, long_side_within, send_cap, target_size

import orjson
import yaml

MODEL = "Qwen/Qwen3-VL-2B-Instruct"


# -- profiles ------------------------------------------------------------------------------
def test_shipped_profiles_cover_the_hardware_table():
    p = load_profiles()
    for name in ("h200", "h100", "a100-80g", "l4", "rtx4090d", "rtx3090", "a10g", "rtx4060ti"):
        assert name in p, name
    assert p["rtx4090d"]["engine"] == "trtllm" and p["rtx4090d"]["dtype"] == "float16"
    assert p["rtx4090d"]["max_num_seqs"] == 4 and p["rtx4090d"]["image_max_long_side"] == 768
    assert p["rtx3090"]["engine"] == "vllm" and p["rtx3090"]["enable_prefix_caching"] and p["rtx3090"]["max_num_seqs"] == 2
    assert p["a10g"]["max_num_seqs"] == 3
    t = p["rtx4060ti"]
    assert (t["quantization"], t["max_num_seqs"], t["max_images_per_prompt"]) == ("awq", 1, 1)
    assert t["cpu_offload_gb"] > 0 and t["image_max_long_side"] < 768
    assert p["h200"]["max_num_seqs"] >= 64
    for prof in p.values():  # the image stage reads this key for every backend
        assert prof["image_max_long_side"] > 0


def test_config_profiles_extend_and_override():
    p = load_profiles({"lab": {"base": "l4", "max_num_seqs": 5}, "h200": {"max_num_seqs": 300}})
    assert p["lab"]["max_num_seqs"] == 5 and p["lab"]["max_model_len"] == p["l4"]["max_model_len"]
    assert p["h200"]["max_num_seqs"] == 300 and p["h200"]["max_model_len"] == 32768
    with pytest.raises(ConfigError, match=r"profiles.bad.max_num_seqs"):
        load_profiles({"bad": {"max_num_seqs": "many"}})
    with pytest.raises(ConfigError, match=r"profiles.bad.colour: unknown key"):
        load_profiles({"bad": {"colour": "red"}})
    with pytest.raises(ConfigError, match="unknown profile"):
        load_profiles({"bad": {"base": "nope"}})
    with pytest.raises(KeyError):
        get_profile("nope")


# -- launch --------------------------------------------------------------------------------
def test_vllm_launch_line_rtx4060ti():
    argv, opts = command_for(get_profile("rtx4060ti"), MODEL + "-AWQ", "0.0.0.0", 8001)
    assert opts == ""
    assert shlex.join(argv) == (
        "vllm serve Qwen/Qwen3-VL-2B-Instruct-AWQ --host 0.0.0.0 --port 8001 --max-model-len 4096 "
        "--max-num-seqs 1 --max-num-batched-tokens 2048 --gpu-memory-utilization 0.92 --dtype float16 "
        "--limit-mm-per-prompt '{\"image\":1,\"video\":1}' "
        "--mm-processor-kwargs '{\"images_kwargs\":{\"size\":{\"longest_edge\":262144,\"shortest_edge\":65536}},"
        "\"videos_kwargs\":{\"size\":{\"longest_edge\":4194304,\"shortest_edge\":4096}}}' "
        "--enable-prefix-caching --quantization awq --cpu-offload-gb 4")


def test_awq_profile_passes_quantization_only_for_an_awq_checkpoint(tmp_path, capsys):
    """vLLM refuses --quantization awq for a checkpoint that is not AWQ: the flag follows the
    model (a local checkpoint's config.json, else its name), and the CLI says why it is left out."""
    from vlm_gateway.cli import main
    argv, _ = command_for(get_profile("rtx4060ti"), MODEL, "127.0.0.1", 8000)
    assert "--quantization" not in argv and "--cpu-offload-gb" in argv
    plain, awq = tmp_path / "plain", tmp_path / "awq-weights"
    plain.mkdir(), awq.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["Qwen3VLForConditionalGeneration"]}))
    (awq / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "awq", "bits": 4}}))
    assert "--quantization" not in command_for(get_profile("rtx4060ti"), str(plain), "127.0.0.1", 8000)[0]
    assert "awq" in command_for(get_profile("rtx4060ti"), str(awq), "127.0.0.1", 8000)[0]
    assert main(["launch", "--profile", "rtx4060ti", "--model", MODEL, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "--quantization" not in out
    assert f"{MODEL} is not AWQ (by its name), so --quantization awq is left out" in err
    assert main(["launch", "--profile", "rtx4060ti", "--model", str(awq), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "--quantization awq" in out and "left out" not in err


def test_launch_engine_option_and_loopback_default(capsys):
    """`launch --engine trtllm` (docs/TRTLLM.md) writes trtllm-serve's line from any profile's
    sizes; engines listen on loopback unless --host says otherwise, and the output says how."""
    from vlm_gateway.cli import main
    assert main(["launch", "--engine", "trtllm", "--profile", "rtx4090d", "--model", MODEL, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith(f"trtllm-serve {MODEL} --host 127.0.0.1 --port 8000 --backend pytorch")
    assert "pass --host 0.0.0.0" in err
    assert main(["launch", "--engine", "vllm", "--profile", "rtx4090d", "--model", MODEL, "--host", "0.0.0.0",
                 "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"vllm serve {MODEL} --host 0.0.0.0 ") and "--max-num-seqs 4 " in out
    assert "--host 0.0.0.0" not in err


def test_vllm_launch_line_h200_and_qwen25_pixels():
    argv, _ = command_for(get_profile("h200"), MODEL, "127.0.0.1", 8000, served_name="qwen3vl")
    line = shlex.join(argv)
    assert line.startswith("vllm serve Qwen/Qwen3-VL-2B-Instruct --host 127.0.0.1 --port 8000 "
                           "--served-model-name qwen3vl --max-model-len 32768 --max-num-seqs 256 ")
    assert "--limit-mm-per-prompt '{\"image\":8,\"video\":2}'" in line and "--enable-prefix-caching" in line
    # video on: the image cap is scoped to images, the video keeps the model's own budget
    assert "--mm-processor-kwargs '{\"images_kwargs\":{\"size\":{\"longest_edge\":1638400," in line
    assert "videos_kwargs" not in line
    assert "--quantization" not in line and "--cpu-offload-gb" not in line
    argv, _ = command_for(get_profile("rtx3090"), "Qwen/Qwen2.5-VL-3B-Instruct", "0.0.0.0", 8000)
    assert ("--mm-processor-kwargs '{\"images_kwargs\":{\"min_pixels\":3136,\"max_pixels\":589824},"
            "\"videos_kwargs\":{\"min_pixels\":3136,\"max_pixels\":8388608}}'") in shlex.join(argv)
    # without video the flat form stays (nothing else reads it)
    no_video = dict(get_profile("rtx3090"), max_videos_per_prompt=0)
    argv, _ = command_for(no_video, "Qwen/Qwen2.5-VL-3B-Instruct", "0.0.0.0", 8000)
    line = shlex.join(argv)
    assert "--mm-processor-kwargs '{\"min_pixels\":3136,\"max_pixels\":589824}'" in line
    assert "\"video\":0" in line


def test_trtllm_launch_line_rtx4090d():
    argv, opts = command_for(get_profile("rtx4090d"), MODEL, "0.0.0.0", 8002, options_path="/tmp/x.yaml")
    assert shlex.join(argv) == (
        "trtllm-serve Qwen/Qwen3-VL-2B-Instruct --host 0.0.0.0 --port 8002 --backend pytorch "
        "--max_batch_size 4 --max_num_tokens 8192 --max_seq_len 8192 "
        "--kv_cache_free_gpu_memory_fraction 0.85 --extra_llm_api_options /tmp/x.yaml")
    assert trtllm_options(get_profile("rtx4090d")) == {
        "kv_cache_config": {"enable_block_reuse": True}, "enable_iter_perf_stats": True,
        "return_perf_metrics": True, "dtype": "float16"}
    assert yaml.safe_load(opts) == trtllm_options(get_profile("rtx4090d"))


TRTLLM_SERVE = json.loads((Path(__file__).parent / "fixtures" / "trtllm-serve-1.2-options.json").read_text())


def _check_against_trtllm_serve(argv: list[str], opts: dict) -> None:
    """Every flag is one trtllm-serve 1.2 accepts, with a value of the right kind; every
    YAML key an LlmArgs field (tests/fixtures/trtllm-serve-1.2-options.json says where from)."""
    known = TRTLLM_SERVE["options"]
    assert argv[0] == "trtllm-serve" and not argv[1].startswith("-")
    i = 2
    while i < len(argv):
        flag = argv[i]
        assert flag in known, f"trtllm-serve 1.2 has no option {flag}"
        kind = known[flag]
        if kind == "flag":
            i += 1
            continue
        value = argv[i + 1]
        if isinstance(kind, list):
            assert value in kind, (flag, value)
        elif kind in ("int", "float"):
            (int if kind == "int" else float)(value)
        i += 2

    def walk(got: dict, schema: dict, path: str = "") -> None:
        for k, v in got.items():
            assert k in schema, f"no LlmArgs field {path}{k}"
            if isinstance(v, dict):
                walk(v, schema[k], f"{path}{k}.")
            elif schema[k] == "bool":
                assert isinstance(v, bool), f"{path}{k}"
    walk(opts, TRTLLM_SERVE["yaml"])


@pytest.mark.parametrize("name", ["rtx4090d", "h200", "rtx4060ti", "l4"])
def test_trtllm_command_lines_use_only_trtllm_serve_options(name):
    prof = dict(get_profile(name), engine="trtllm")
    argv, opts = command_for(prof, MODEL, "127.0.0.1", 8000, options_path="/tmp/o.yaml")
    body = yaml.safe_load(opts)
    _check_against_trtllm_serve(argv, body)
    # what the gateway reads needs these two; block reuse follows the profile
    assert body["enable_iter_perf_stats"] is True and body["return_perf_metrics"] is True
    assert body["kv_cache_config"]["enable_block_reuse"] is bool(prof.get("enable_prefix_caching", True))
    # quantization comes from the checkpoint on the PyTorch backend: never an invented quant_algo
    assert "quant_config" not in body and "--trust_remote_code" not in argv


def test_trtllm_launch_with_quantized_profile_says_where_quantization_comes_from(capsys, tmp_path):
    from vlm_gateway.cli import main
    cfg = tmp_path / "g.yaml"
    cfg.write_text("profiles:\n  trt-awq: {base: rtx4060ti, engine: trtllm}\n")
    assert main(["launch", "--profile", "trt-awq", "--model", MODEL, "--config", str(cfg), "--dry-run",
                 "--options-file", str(tmp_path / "o.yaml")]) == 0
    out, err = capsys.readouterr()
    assert "takes the quantization from the checkpoint" in err
    assert "quant_config" not in out and "enable_iter_perf_stats: true" in out
    assert out.splitlines()[-1].startswith("trtllm-serve Qwen/Qwen3-VL-2B-Instruct ")


def test_launch_cli_dry_run(capsys):
    from vlm_gateway.cli import main
    assert main(["launch", "--profile", "a10g", "--model", MODEL, "--port", "9000", "--dry-run"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("vllm serve Qwen/Qwen3-VL-2B-Instruct --host 127.0.0.1 --port 9000 ")
    assert "--max-num-seqs 3 " in out
    assert main(["launch", "--profile", "nope", "--model", MODEL, "--dry-run"]) == 2


# -- scraping ------------------------------------------------------------------------------
def test_scrape_parses_known_names_of_every_engine():
    vllm = ('# HELP vllm:num_requests_running x\n'
            'vllm:num_requests_running{model_name="m",engine="0"} 3.0\n'
            'vllm:num_requests_running{model_name="m",engine="1"} 2.0\n'
            'vllm:num_requests_waiting{model_name="m"} 4\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
            'vllm:prefix_cache_hits_total{model_name="m"} 100\n'
            'vllm:prefix_cache_queries_total{model_name="m"} 400\n')
    assert extract(parse(vllm)) == {"running": 5.0, "waiting": 4.0, "kv_usage": 0.25,
                                    "prefix_hits": 100.0, "prefix_queries": 400.0}
    # an older vLLM name for the same quantity
    assert extract(parse('vllm:gpu_cache_usage_perc{a="b c"} 0.5\n')) == {"kv_usage": 0.5}
    assert extract(parse("garbage line\nother_metric 1\n")) == {}
    # names TensorRT-LLM never exported are not read (its real ones: test_scrape_trtllm.py)
    invented = ("trtllm:num_requests_running 2\ntrtllm_prefix_cache_hits_total 5\n"
                "trtllm_prefix_cache_queries_total 9\ntrtllm:kv_cache_utilization 0.5\n")
    assert extract(parse(invented)) == {}


# -- load ------------------------------------------------------------------------------------
def _backend(name: str, profile: str | None = "h200", **kw) -> Backend:
    b = Backend(name=name, base_url=f"http://{name}/v1", models={"m"},
                profile=get_profile(profile) if profile else {})
    for k, v in kw.items():
        setattr(b, k, v)
    return b


def test_load_combines_engine_figures_and_fresh_inflight():
    b = _backend("a", "rtx3090")  # capacity 2
    assert load(b) == 0.0
    b.inflight = 1
    assert load(b) == 0.5
    # the engine (shared with other gateways) reports 3 running + 1 waiting when we had 1 in flight
    b.stats = EngineStats.from_figures({"running": 3, "waiting": 1, "kv_usage": 0.1}, 1, time.monotonic())
    assert load(b) == 2.0
    b.inflight = 0  # ours finished since the scrape
    assert load(b) == 1.5
    b.stats = replace(b.stats, kv_usage=1.7 / 1)  # kv pressure dominates when higher
    assert load(b) == 1.7
    b.stats = replace(b.stats, at=time.monotonic() - 10)  # stale scrape: in-flight only
    assert load(b) == 0.0


# -- prefix keys and policies ----------------------------------------------------------------
def _req(messages, model="m", **body):
    raw = orjson.dumps({"model": model, "messages": messages, **body})
    return parse_chat(raw, {})


def _img(url="data:image/png;base64,AAAA"):
    return {"type": "image_url", "image_url": {"url": url}}


def test_prefix_keys_chain_across_turns_and_see_images():
    t1 = [{"role": "system", "content": "be brief"},
          {"role": "user", "content": [_img(), {"type": "text", "text": "what is this?"}]}]
    t2 = t1 + [{"role": "assistant", "content": "a cat"}, {"role": "user", "content": "and its colour?"}]
    k1, _ = prefix_keys(_req(t1))
    k2, total2 = prefix_keys(_req(t2))
    assert [k for k, _ in k2[:len(k1)]] == [k for k, _ in k1]
    assert len(k2) == len(k1) + 2 and total2 == k2[-1][1]
    other_image = [t1[0], {"role": "user", "content": [_img("data:image/png;base64,BBBB"),
                                                       {"type": "text", "text": "what is this?"}]}]
    ko, _ = prefix_keys(_req(other_image))
    assert ko[0][0] == k1[0][0] and ko[-1][0] != k1[-1][0]
    # the image stage's content hash wins over the URL
    r = _req(t1)
    r.images[0].content_hash = "abc"
    assert prefix_keys(r)[0][-1][0] != k1[-1][0]
    # text-only keys cannot tell the two images apart
    assert prefix_keys(_req(other_image), include_images=False)[0][-1][0] == \
        prefix_keys(_req(t1), include_images=False)[0][-1][0]
    # and different models never share keys
    assert prefix_keys(_req(t1, model="n"))[0][0][0] != k1[0][0]


def test_prefix_map_is_bounded_and_expires():
    now = [0.0]
    m = PrefixMap(ttl_s=10, max_entries=3, clock=lambda: now[0])
    m.put_many([b"a", b"b", b"c", b"d"], "x")
    now[0] = 1
    assert len(m) == 3 and m.get(b"a") is None and m.get(b"d") == "x"
    now[0] = 11
    assert m.get(b"d") is None


def test_affinity_follows_prefix_unless_overloaded_or_weak():
    cfg = RoutingConfig(affinity_max_load=0.9, affinity_min_match=0.5)
    pol = get_policy("affinity", cfg)
    a, b, c = (_backend(n) for n in "abc")
    t1 = [{"role": "user", "content": [_img(), {"type": "text", "text": "describe"}]}]
    first = pol.rank(_req(t1), [a, b, c])[0]
    pol.served(_req(t1), first)
    t2 = t1 + [{"role": "assistant", "content": "x" * 40}, {"role": "user", "content": "more"}]
    for _ in range(5):  # sticks whatever the rotation
        assert pol.rank(_req(t2), [a, b, c])[0] is first
    first.inflight = int(0.95 * first.capacity)  # overloaded: least load wins
    assert pol.rank(_req(t2), [a, b, c])[0] is not first
    first.inflight = 6  # far from full, but 6 sequences busier than idle peers: least load wins
    assert pol.rank(_req(t2), [a, b, c])[0] is not first
    first.inflight = 3  # within the slack: the cache hit is worth the wait
    assert pol.rank(_req(t2), [a, b, c])[0] is first
    first.inflight = 0
    # a new chat sharing only a short system prompt is not pinned (weak match): it spreads
    sys = {"role": "system", "content": "you are helpful"}
    pol.served(_req([sys, {"role": "user", "content": [_img("data:image/png;base64,Z1"), {"type": "text", "text": "q"}]}]), a)
    picks = {pol.rank(_req([sys, {"role": "user", "content": [_img(f"data:image/png;base64,N{i}"),
                                                               {"type": "text", "text": "q"}]}]), [a, b, c])[0].name
             for i in range(6)}
    assert picks == {"a", "b", "c"}
    # the remembered backend is gone from the candidates: fall back to the others
    assert pol.rank(_req(t2), [x for x in (a, b, c) if x is not first])[0] is not first


def test_policy_registry_and_default():
    assert {"round_robin", "least_loaded", "affinity", "text_prefix"} <= set(policy_names())
    assert GatewayConfig().routing.policy == "affinity"


def test_least_loaded_prefers_idle_and_rotates_ties():
    pol = get_policy("least_loaded", RoutingConfig())
    a, b, c = (_backend(n) for n in "abc")
    a.inflight, b.inflight = 5, 1
    assert [x.name for x in pol.rank(None, [a, b, c])] == ["c", "b", "a"]
    c.inflight = 1
    firsts = {pol.rank(None, [a, b, c])[0].name for _ in range(4)}
    assert firsts == {"b", "c"}


# -- profile filter --------------------------------------------------------------------------
def test_profile_filter_images_pixels_and_context():
    f = ProfileFilter(GatewayConfig())
    small, big = _backend("small", "rtx4060ti"), _backend("big", "h200")
    three = _req([{"role": "user", "content": [_img(), _img(), _img(), {"type": "text", "text": "compare"}]}])
    assert "3 images exceed the 1-image limit" in f(three, small)
    assert f(three, big) is None
    # a 12 MP photo: rewritten to 512 px for the small card, admitted by both
    one = _req([{"role": "user", "content": [_img(), {"type": "text", "text": "what"}]}], max_tokens=100)
    one.images[0].width, one.images[0].height = 4000, 3000
    assert f(one, small) is None and f(one, big) is None
    # context: prompt + max_tokens beyond the 4096 of the small card
    long = _req([{"role": "user", "content": "x" * 12000}], max_tokens=2000)
    assert "exceed the 4096-token context" in f(long, small)
    assert f(long, big) is None
    # without rewriting, a big image is refused by the small card's budget
    cfg = GatewayConfig()
    cfg.images.enabled = False
    assert "above the 512 px long side" in ProfileFilter(cfg)(one, small)
    # a backend without a profile admits everything
    assert f(three, _backend("plain", None)) is None


def test_profile_filter_takes_the_image_budget_the_image_stage_resolves():
    """Per-model and per-tenant image keys decide the size admission checks, as they decide
    the size the image stage rewrites to (one resolution: policy.model_settings)."""
    cfg = GatewayConfig()
    b = _backend("b", "h200")
    b.profile = {**b.profile, "image_max_long_side": 0, "image_max_pixels": 1_000_000}
    one = _req([{"role": "user", "content": [_img(), {"type": "text", "text": "what"}]}])
    one.images[0].width, one.images[0].height = 4000, 3000
    assert ProfileFilter(cfg)(one, b) is None                      # 768 px long side: 768x576
    cfg.images.models = {"m": {"max_long_side": 2048}}
    assert "exceeds the 1000000-pixel budget" in ProfileFilter(cfg)(one, b)
    one.state[TENANT] = TenantConfig(name="t", key_sha256="ab" * 32, images={"max_long_side": 1024})
    assert ProfileFilter(cfg)(one, b) is None                      # the tenant's 1024 px: 1024x768


def test_profile_filter_counts_images_at_the_size_the_image_stage_sends():
    """A text screenshot the legibility-aware budget sends at 1280x704 costs 880 visual
    tokens, not the 336 of the fixed 768 px rule: the context check counts what is sent."""
    f = ProfileFilter(GatewayConfig())
    b = _backend("b", "h200")
    b.profile = {**b.profile, "image_max_long_side": 0, "max_model_len": 1200}
    shot = _req([{"role": "user", "content": [_img(), {"type": "text", "text": "read it"}]}], max_tokens=600)
    shot.images[0].width, shot.images[0].height = 1920, 1080
    assert f(shot, b) is None                                  # not sized yet: the fixed 768 px estimate
    shot.images[0].sent_width, shot.images[0].sent_height = 1280, 704
    assert "exceed the 1200-token context" in f(shot, b)
    b.profile["max_model_len"] = 1600
    assert f(shot, b) is None
    # sent larger than this backend's limits (its model's backends differ): counted at the
    # size before_send brings it to, within the 1280 px cap and the 921600-pixel budget
    # (1184x768: 888 visual tokens), never refused for its pixels
    shot.images[0].sent_width, shot.images[0].sent_height = 1888, 1184
    capped = _backend("capped", "h200")
    capped.profile = {**capped.profile, "image_max_long_side": 1280, "max_model_len": 1460,
                      "image_max_pixels": 1280 * 720}
    assert target_size(1888, 1184, send_cap(1888, 1184, 1280, 1280 * 720)) == (1184, 768)
    assert "exceed the 1460-token context" in f(shot, capped)
    capped.profile["max_model_len"] = 1600
    assert f(shot, capped) is None
    # sent above this backend's pixel budget (its models' backends differ): counted at the
    # size before_send brings it to (1696x960, 1590 tokens), not refused for its pixels
    shot.images[0].sent_width, shot.images[0].sent_height = 1920, 1080
    assert b.image_pixels == 1638400
    assert "exceed the 1600-token context" in f(shot, b)
    b.profile["max_model_len"] = 2400
    assert f(shot, b) is None


def test_long_side_within_a_pixel_budget_is_the_largest_that_fits():
    import random
    rnd = random.Random(3)
    for _ in range(400):
        w, h = rnd.randint(200, 8000), rnd.randint(200, 8000)
        px = rnd.choice([401_408, 1_003_520, 1_638_400, 3_686_400])
        side = long_side_within(w, h, px, 32)
        if w * h <= px:
            assert side == 0
            continue
        tw, th = target_size(w, h, side, 32)
        assert tw * th <= px, (w, h, px, side)
        bw, bh = target_size(w, h, side + 32, 32)  # one grid cell longer no longer fits
        assert bw * bh > px or (bw, bh) == (tw, th), (w, h, px, side)
    assert long_side_within(1920, 1080, 0) == 0
    assert send_cap(1920, 1080, 0, 0) == 0 and send_cap(1920, 1080, 1280, 0) == 1280
    assert send_cap(1920, 1080, 0, 1638400) == long_side_within(1920, 1080, 1638400) < 1920
    assert send_cap(1920, 1080, 1280, 1638400) == 1280 and send_cap(1000, 800, 0, 1638400) == 0


def test_text_token_estimates_are_the_simulators_counts():
    """Admission's text estimate and the simulator's prompt count follow one rule
    (vision_tokens: ~4 bytes a token plus Qwen3-VL's chat template)."""
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "what is on this screen?"}]}]
    req = _req(messages)
    assert text_tokens(req) == build_prompt({"messages": messages}).num_tokens == 7 + 5 + 2 + 5 + 6
    assert build_prompt({"messages": [{"role": "user", "content": "hi"}]}).num_tokens == 13  # as vLLM counted
    # a completions prompt: text, token ids, or a batch of either
    assert estimate_prompt_tokens("abcdefgh") == 2 and estimate_prompt_tokens([1, 2, 3]) == 3
    assert estimate_prompt_tokens(["abcd", [5, 6]]) == 3 and estimate_prompt_tokens(None) == 0


def _video(url="data:video/mp4;base64,AAAA"):
    return {"type": "video_url", "video_url": {"url": url}}


def test_profile_filter_counts_videos_and_their_tokens():
    f = ProfileFilter(GatewayConfig())
    small, big = _backend("small", "rtx4060ti"), _backend("big", "h200")
    two = _req([{"role": "user", "content": [_video(), _video("data:video/mp4;base64,BBBB"),
                                             {"type": "text", "text": "compare"}]}])
    assert f(two, big) is None                                   # h200: 2 videos a prompt
    assert "2 videos exceed the 1-video limit" in f(two, small)  # the profile's default: 1
    novideo = _backend("novideo", "h200")
    novideo.profile = {**novideo.profile, "max_videos_per_prompt": 0}
    assert "exceed the 0-video limit" in f(two, novideo)
    # a rewritten video's tokens count against the context
    one = _req([{"role": "user", "content": [_video(), {"type": "text", "text": "what"}]}], max_tokens=100)
    assert f(one, small) is None
    one.media[0].tokens_after = 4000
    assert "exceed the 4096-token context" in f(one, small)
    assert f(one, big) is None
