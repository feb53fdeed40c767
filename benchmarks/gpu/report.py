"""Turn the JSON results of benchmarks/gpu/loadgen.py into the markdown tables of
docs/benchmarks/gpu.md.

    python benchmarks/gpu/report.py docs/benchmarks/gpu/images-run2.json \
        docs/benchmarks/gpu/tokens.json docs/benchmarks/gpu/affinity-{round_robin,least_loaded,affinity}.json
"""

from __future__ import annotations

import json
import sys


def images(data: dict) -> str:
    cells = {(c["kind"], c["conc"], c["mode"]): c for c in data["cells"]}
    rows = ["| image | conc | (a) direct raw TTFT p50 / req/s | (b) direct pre-rewritten | (c) raw via gateway | "
            "(c)/(b) TTFT | (c)/(b) req/s | (a)/(c) TTFT gain |", "|---|---|---|---|---|---|---|---|"]
    for kind, conc in sorted({(k, c) for k, c, _ in cells}, key=lambda x: (x[0] != "1080p", x[1])):
        a, b, c = (cells[(kind, conc, m)] for m in ("a_direct_raw", "b_direct_prerewritten", "c_gateway_raw"))
        name = "1920x1080 screenshot" if kind == "1080p" else "4032x3024 photo"
        rows.append(f"| {name} | {conc} | {a['ttft_p50_ms']:.0f} ms / {a['rps']:.2f} | {b['ttft_p50_ms']:.0f} ms / "
                    f"{b['rps']:.2f} | {c['ttft_p50_ms']:.0f} ms / {c['rps']:.2f} | "
                    f"{c['ttft_p50_ms'] / b['ttft_p50_ms']:.2f}x | {c['rps'] / b['rps']:.2f}x | "
                    f"{a['ttft_p50_ms'] / c['ttft_p50_ms']:.1f}x |")
    return "\n".join(rows)


def tokens(data: dict) -> str:
    rows = ["| image | rewritten to | header before/after | vLLM prompt_tokens direct | via gateway | "
            "text + after + 2 | exact |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        expect = r["text_tokens"] + r["header_after"] + 2
        rows.append(f"| {r['size']} | {r['rewritten_to']} | {r['header_before']} / {r['header_after']} | "
                    f"{r['direct_prompt_tokens']} | {r['gateway_prompt_tokens']} | {expect} | "
                    f"{'yes' if expect == r['gateway_prompt_tokens'] else 'NO'} |")
    return "\n".join(rows)


def affinity(results: list[dict]) -> str:
    rows = ["| policy | TTFT mean | p50 | p99 | req/s | later turns with the previous turn cached | "
            "cached share of later-turn prompt tokens | engines' prefix-cache hit rate | requests per engine |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r['policy']} | {r['ttft_mean_ms']:.0f} ms | {r['ttft_p50_ms']:.0f} ms | "
                    f"{r['ttft_p99_ms']:.0f} ms | {r['rps']:.1f} | {r['later_turns_prefix_hit_rate'] * 100:.1f}% | "
                    f"{r['later_turns_cached_token_ratio'] * 100:.1f}% | {r['engine_prefix_hit_rate'] * 100:.1f}% | "
                    f"{', '.join(f'{k} {v}' for k, v in sorted(r['per_backend'].items()))} |")
    return "\n".join(rows)


def main() -> None:
    docs = [json.load(open(p)) for p in sys.argv[1:]]
    aff = [d for d in docs if "policy" in d]
    for d in docs:
        if "cells" in d:
            print(images(d) + "\n")
        elif "rows" in d:
            print(tokens(d) + "\n")
    if aff:
        print(affinity(aff))


if __name__ == "__main__":
    main()
