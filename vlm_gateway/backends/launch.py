"""``vlm-gateway launch``: the engine command line a GPU profile implies.

vLLM (``vllm serve``, flags of vLLM 0.24): ``--max-model-len``, ``--max-num-seqs``,
``--gpu-memory-utilization``, ``--limit-mm-per-prompt`` (JSON form),
``--mm-processor-kwargs`` (JSON; Qwen3-VL takes ``size.longest_edge`` /
``size.shortest_edge`` in pixels, Qwen2/2.5-VL ``max_pixels`` / ``min_pixels``),
``--enable-prefix-caching``, ``--quantization``, ``--cpu-offload-gb``,
``--max-num-batched-tokens``, ``--dtype``.

Video (``max_videos_per_prompt`` > 0): the processor kwargs go per modality
(``images_kwargs`` / ``videos_kwargs``, transformers' ``ProcessorMixin._merge_kwargs``):
a flat ``size`` would reach Qwen3-VL's video processor too, where ``longest_edge`` is the
budget of *all* frames together, and shrink every video to a few hundred tokens.

TensorRT-LLM (``trtllm-serve MODEL``, PyTorch backend; options of release 1.2.1,
tensorrt_llm/commands/serve.py): ``--backend pytorch``, ``--max_batch_size``,
``--max_num_tokens``, ``--max_seq_len``, ``--kv_cache_free_gpu_memory_fraction`` (a
fraction of the memory left after the weights, not of the whole GPU as vLLM's
``--gpu-memory-utilization``) and ``--extra_llm_api_options FILE`` (alias ``--config``
from the 1.2 line on) for LLM API arguments without a flag:

    kv_cache_config.enable_block_reuse   prefix (KV block) reuse; multimodal prompts are
                                         hashed with their images (Qwen3-VL: supported)
    enable_iter_perf_stats: true         fills /metrics with iteration statistics (the
                                         PyTorch backend's default is false)
    return_perf_metrics: true            mounts /prometheus/metrics (load gauges from the
                                         1.3 pre-releases on)
    dtype                                when the profile sets one

Qwen3-VL (Qwen3VLForConditionalGeneration) is in the PyTorch backend from the 1.2 line,
with chunked prefill and KV cache reuse; it needs no remote code (transformers 4.57.3,
pinned by 1.2.1, has it). The backend reads quantization from the checkpoint, so a
profile's ``quantization`` is a note to pick a quantized checkpoint, not an option.
trtllm-serve has no image-size option: the gateway's rewrite is the only budget.
Sources and versions: docs/TRTLLM.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from typing import Any

from ..vision_tokens import QWEN3_MIN_PIXELS

QWEN3_VIDEO_MIN_PIXELS = 4096   # Qwen3-VL's video_preprocessor_config.json size.shortest_edge


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=False)


def mm_processor_kwargs(model: str, profile: dict[str, Any]) -> dict[str, Any] | None:
    px = int(profile.get("image_max_pixels") or 0)
    vpx = int(profile.get("video_max_pixels") or 0)
    video = int(profile.get("max_videos_per_prompt", 1) or 0) > 0
    qwen2 = "qwen2" in model.lower()
    image = None
    if px:
        # Qwen2-VL / Qwen2.5-VL image processors read min/max_pixels; Qwen3-VL size.{shortest,longest}_edge
        image = ({"min_pixels": min(3136, px), "max_pixels": px} if qwen2 else
                 {"size": {"longest_edge": px, "shortest_edge": min(QWEN3_MIN_PIXELS, px)}})
    if not video:
        return image
    out: dict[str, Any] = {}
    if image:
        out["images_kwargs"] = image
    if vpx:
        out["videos_kwargs"] = ({"min_pixels": min(3136, vpx), "max_pixels": vpx} if qwen2 else
                                {"size": {"longest_edge": vpx, "shortest_edge": min(QWEN3_VIDEO_MIN_PIXELS, vpx)}})
    return out or None


def checkpoint_quantization(model: str) -> str | None:
    """The quantization method of a local checkpoint (its config.json's
    ``quantization_config.quant_method``, '' when it has none); None for a hub name,
    whose config is not read here."""
    path = os.path.join(os.path.expanduser(model), "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            qc = json.load(f).get("quantization_config") or {}
    except (OSError, ValueError, AttributeError):
        return None
    return str(qc.get("quant_method") or "").lower() if isinstance(qc, dict) else ""


def quantization_applies(model: str, quantization: str) -> bool:
    """Whether a profile's ``quantization`` fits the model: a local checkpoint's config
    says so; a hub name must carry the method (``...-AWQ``, ``...-FP8``). vLLM refuses a
    ``--quantization`` the checkpoint was not made with."""
    q = quantization.lower()
    found = checkpoint_quantization(model)
    if found is not None:
        return found == q
    return q in model.lower()


def vllm_command(model: str, profile: dict[str, Any], host: str = "127.0.0.1", port: int = 8000,
                 served_name: str = "") -> list[str]:
    p = profile
    cmd = ["vllm", "serve", model, "--host", host, "--port", str(port)]
    if served_name:
        cmd += ["--served-model-name", served_name]
    if p.get("max_model_len"):
        cmd += ["--max-model-len", str(p["max_model_len"])]
    if p.get("max_num_seqs"):
        cmd += ["--max-num-seqs", str(p["max_num_seqs"])]
    if p.get("max_num_batched_tokens"):
        cmd += ["--max-num-batched-tokens", str(p["max_num_batched_tokens"])]
    cmd += ["--gpu-memory-utilization", f"{float(p.get('gpu_memory_utilization') or 0.9):g}"]
    if p.get("dtype") and p["dtype"] != "auto":
        cmd += ["--dtype", p["dtype"]]
    if p.get("max_images_per_prompt"):
        videos = int(p.get("max_videos_per_prompt", 1) or 0)
        cmd += ["--limit-mm-per-prompt", _compact({"image": int(p["max_images_per_prompt"]), "video": videos})]
    kw = mm_processor_kwargs(model, p)
    if kw:
        cmd += ["--mm-processor-kwargs", _compact(kw)]
    cmd.append("--enable-prefix-caching" if p.get("enable_prefix_caching", True) else "--no-enable-prefix-caching")
    if p.get("quantization") and quantization_applies(model, p["quantization"]):
        cmd += ["--quantization", p["quantization"]]
    if p.get("cpu_offload_gb"):
        cmd += ["--cpu-offload-gb", f"{float(p['cpu_offload_gb']):g}"]
    cmd += list(p.get("engine_flags") or [])
    return cmd


def trtllm_options(profile: dict[str, Any]) -> dict[str, Any]:
    """The ``--extra_llm_api_options`` YAML body (LLM API arguments without a flag)."""
    opts: dict[str, Any] = {
        "kv_cache_config": {"enable_block_reuse": bool(profile.get("enable_prefix_caching", True))},
        # the gateway's load figures: /metrics (JSON) and, in newer releases, /prometheus/metrics
        "enable_iter_perf_stats": True,
        "return_perf_metrics": True,
    }
    if profile.get("dtype") and profile["dtype"] != "auto":
        opts["dtype"] = profile["dtype"]
    return opts


def trtllm_command(model: str, profile: dict[str, Any], host: str = "127.0.0.1", port: int = 8000,
                   options_path: str = "extra_llm_api_options.yaml") -> list[str]:
    p = profile
    cmd = ["trtllm-serve", model, "--host", host, "--port", str(port), "--backend", "pytorch"]
    if p.get("max_num_seqs"):
        cmd += ["--max_batch_size", str(p["max_num_seqs"])]
    if p.get("max_num_batched_tokens"):
        cmd += ["--max_num_tokens", str(p["max_num_batched_tokens"])]
    if p.get("max_model_len"):
        cmd += ["--max_seq_len", str(p["max_model_len"])]
    cmd += ["--kv_cache_free_gpu_memory_fraction", f"{float(p.get('gpu_memory_utilization') or 0.9):g}",
            "--extra_llm_api_options", options_path]
    cmd += list(p.get("engine_flags") or [])
    return cmd


def _yaml(obj: dict[str, Any]) -> str:
    import yaml
    return yaml.safe_dump(obj, sort_keys=False)


def command_for(profile: dict[str, Any], model: str, host: str, port: int, served_name: str = "",
                options_path: str = "extra_llm_api_options.yaml") -> tuple[list[str], str]:
    """(argv, trtllm options YAML or ''); the engine is the profile's ``engine``."""
    if profile.get("engine") == "trtllm":
        return trtllm_command(model, profile, host, port, options_path), _yaml(trtllm_options(profile))
    return vllm_command(model, profile, host, port, served_name), ""


def cmd_launch(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from ..config_load import read_config
    from . import config_names
    from .profiles import load_profiles
    try:
        extra = {}
        if args.config:
            cfg = read_config(args.config)
            config_names.check(cfg)
            extra = cfg.profiles
        profiles = load_profiles(extra)
    except ConfigError as e:
        print(f"vlm-gateway launch: config error: {e}", file=sys.stderr)
        return 2
    if args.profile not in profiles:
        print(f"vlm-gateway launch: unknown profile {args.profile!r}; known: {', '.join(sorted(profiles))}",
              file=sys.stderr)
        return 2
    prof = dict(profiles[args.profile])
    if args.engine:
        prof["engine"] = args.engine  # the profile's sizes, another engine's command line
    opts_path = args.options_file or os.path.join(tempfile.gettempdir(), f"trtllm-{args.profile}-{args.port}.yaml")
    argv, opts = command_for(prof, args.model, args.host, args.port, args.served_model_name or "", opts_path)
    quant = prof.get("quantization") or ""
    if quant and prof.get("engine") == "trtllm":
        print("# note: trtllm-serve's PyTorch backend takes the quantization from the checkpoint "
              "(e.g. a ModelOpt-quantized one); it is not passed as an option", file=sys.stderr)
    elif quant and not quantization_applies(args.model, quant):
        q = quant.upper()
        print(f"# note: profile {args.profile} is sized for {q} weights; {args.model} is not {q} "
              f"(by its {'config.json' if checkpoint_quantization(args.model) is not None else 'name'}), "
              f"so --quantization {quant} is left out: give a {q} checkpoint (e.g. {args.model}-{q}) "
              "for the profile's memory figures", file=sys.stderr)
    if args.host in ("127.0.0.1", "localhost", "::1"):
        print(f"# note: the engine listens on {args.host} only (it is started without an API key); for a gateway on "
              "another machine pass --host 0.0.0.0 and keep the engine's port behind a firewall that only the "
              "gateway passes (docs/DEPLOYMENT.md)", file=sys.stderr)
    if args.dry_run:
        if opts:
            print(f"cat > {shlex.quote(opts_path)} <<'EOF'\n{opts}EOF")
        print(shlex.join(argv))
        return 0
    if opts:
        with open(opts_path, "w", encoding="utf-8") as f:
            f.write(opts)
    print(shlex.join(argv), file=sys.stderr, flush=True)
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        print(f"vlm-gateway launch: {argv[0]} is not installed (use --dry-run to print the command)",
              file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return


def add_parser(sub) -> None:
    p = sub.add_parser("launch", help="print or run the engine command of a GPU profile",
                       description="Print (--dry-run) or run the engine command line a GPU profile implies: "
                                   "vllm serve or trtllm-serve, with the profile's limits.")
    p.add_argument("--profile", required=True, help="GPU profile name (backends/profiles.yaml or config)")
    p.add_argument("--model", required=True, help="model name or path, e.g. Qwen/Qwen3-VL-2B-Instruct")
    p.add_argument("--engine", choices=["vllm", "trtllm"], default=None,
                   help="engine whose command line to write (vllm serve or trtllm-serve); default: the profile's")
    p.add_argument("--port", type=int, default=8000, help="engine port (default 8000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="engine listen address (default 127.0.0.1: engines take no API key; 0.0.0.0 to reach "
                        "it from a gateway on another machine, behind a firewall)")
    p.add_argument("--served-model-name", default="", help="vllm --served-model-name (the model name clients send)")
    p.add_argument("--config", help="gateway config whose `profiles:` extend the shipped ones")
    p.add_argument("--options-file", help="where to write trtllm-serve's extra LLM API options YAML")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    p.set_defaults(func=cmd_launch)
