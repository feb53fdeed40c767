"""Kubernetes discovery against recorded EndpointSlice list/watch responses
(tests/fixtures/k8s/endpointslice-watch.json: discovery.k8s.io/v1 shapes, written from
the API reference). Never run against a live cluster here: the selection rules are driven
event by event in process, and the watch client through the real kubernetes-asyncio
client against a loopback replay of the same responses.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest

from vlm_gateway import metrics
from vlm_gateway.backends.discovery.slices import SliceSet, ready_endpoints
from vlm_gateway.config import DiscoveryConfig
from waiting import async_wait_until

pytest.importorskip("kubernetes_asyncio")

from k8s_replay import K8sReplay  # noqa: E402
from vlm_gateway.backends.discovery.kubernetes import KubernetesDiscovery, pod_overrides  # noqa: E402

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "k8s" / "endpointslice-watch.json").read_text())
E = FIXTURE["events"]

# the ready pods after the list and after each event (ERROR ends the watch: no change)
EXPECTED = [
    {"vllm-0"},                      # list: vllm-1 still loading (ready=false)
    {"vllm-0", "vllm-1"},            # 1 vllm-1 ready
    {"vllm-0", "vllm-1"},            # 2 bookmark
    {"vllm-0", "vllm-1", "vllm-2"},  # 3 second slice
    {"vllm-1", "vllm-2"},            # 4 vllm-0 terminating (serving, not ready): no new requests
    {"vllm-1", "vllm-2"},            # 5 vllm-0 gone
    {"vllm-1", "vllm-2"},            # 6 vllm-1 in both slices: once
    {"vllm-1"},                      # 7 second slice deleted
]


def pods(s: SliceSet) -> set[str]:
    return {e.pod for e in s.endpoints()}


def test_recorded_watch_stream_event_by_event():
    s = SliceSet()
    s.reset(FIXTURE["list"]["items"], FIXTURE["list"]["metadata"]["resourceVersion"])
    assert pods(s) == EXPECTED[0] and s.resource_version == "48211"
    for i, ev in enumerate(E[:-1], start=1):
        s.apply(ev["type"], ev["object"])
        assert pods(s) == EXPECTED[i], (i, ev["type"])
    assert s.resource_version == "48371"
    eps = s.endpoints()
    assert len(eps) == 1 and (eps[0].address, eps[0].port) == ("10.244.2.9", 8000)
    assert (eps[0].node, eps[0].zone) == ("gpu-node-b", "us-east1-c")


def test_selection_rules():
    sl = copy.deepcopy(FIXTURE["list"]["items"][0])
    # a nil `ready` is ready (the API's rule); a missing conditions block too
    sl["endpoints"][1]["conditions"] = {}
    assert {e.pod for e in ready_endpoints(sl)} == {"vllm-0", "vllm-1"}
    del sl["endpoints"][1]["conditions"]
    assert len(ready_endpoints(sl)) == 2
    # the named port, not another one
    sl["ports"] = [{"name": "metrics", "protocol": "TCP", "port": 9090}, {"name": "http", "protocol": "TCP", "port": 8000}]
    assert {e.port for e in ready_endpoints(sl, "http")} == {8000}
    assert {e.port for e in ready_endpoints(sl)} == {9090}
    assert ready_endpoints(sl, "grpc") == []
    # FQDN slices carry names, not addresses: skipped; IPv6 kept
    assert ready_endpoints({**sl, "addressType": "FQDN"}) == []
    assert ready_endpoints({**sl, "addressType": "IPv6"})
    # an endpoint without a Pod reference is named by its address
    sl["endpoints"][0]["targetRef"] = {"kind": "Node", "name": "n1"}
    assert ready_endpoints(sl)[0].pod == ""


def test_pod_declarations():
    p = FIXTURE["pods"]["vllm-2"]["metadata"]
    assert pod_overrides(p["labels"], p["annotations"]) == {
        "profile": "l4", "engine": "trtllm", "models": ("Qwen/Qwen3-VL-2B-Instruct", "qwen3-vl")}
    # an annotation beats a label; an unknown engine is ignored
    assert pod_overrides({"vlm-gateway.io/profile": "l4"}, {"vlm-gateway.io/profile": "h200",
                                                             "vlm-gateway.io/engine": "tgi"}) == {"profile": "h200"}
    assert pod_overrides(None, None) == {}


async def test_watch_through_the_real_client(tmp_path):
    replay = await K8sReplay(FIXTURE["list"], FIXTURE["pods"]).start()
    entry = DiscoveryConfig(kind="kubernetes", service="vllm", kubeconfig=replay.kubeconfig(str(tmp_path)),
                            namespace="llm", engine="vllm", profile="a100")
    src = KubernetesDiscovery(entry)
    published: list[list] = []
    changed = asyncio.Event()

    def publish(targets):
        published.append(targets)
        changed.set()

    async def next_list():
        await asyncio.wait_for(changed.wait(), 10)
        changed.clear()
        return {t.name: t for t in published[-1]}

    task = asyncio.create_task(src.run(publish))
    try:
        got = await next_list()
        assert set(got) == {"vllm-0"}
        t = got["vllm-0"]
        # the pod's label and annotation, over the entry's template
        assert (t.url, t.profile, t.engine, t.models) == ("http://10.244.1.17:8000/v1", "h200", "vllm",
                                                          ("Qwen/Qwen3-VL-2B-Instruct",))
        q = replay.lists()[0]
        assert q["labelSelector"] == "kubernetes.io/service-name=vllm"
        assert all(a == "Bearer replay-token" for _, _, a in replay.requests)
        await asyncio.wait_for(replay.watching.wait(), 10)
        w = replay.watches()[0]
        assert w["resourceVersion"] == "48211" and w["allowWatchBookmarks"] in ("true", "True")
        replay.push(E[0])
        assert set(await next_list()) == {"vllm-0", "vllm-1"}
        # a bookmark publishes nothing; the server ends the watch; the client resumes from the bookmark
        replay.push(E[1])
        replay.end_watch()
        await async_wait_until(lambda: len(replay.watches()) == 2 and replay.watching.is_set(),
                               "the client opened its second watch")
        assert replay.watches()[-1]["resourceVersion"] == "48301" and len(replay.lists()) == 1
        assert len(published) == 2
        replay.push(E[2])
        got = await next_list()
        assert set(got) == {"vllm-0", "vllm-1", "vllm-2"}
        assert (got["vllm-2"].profile, got["vllm-2"].engine) == ("l4", "trtllm")
        for i in (3, 4, 5, 6):
            replay.push(E[i])
        await async_wait_until(lambda: {t.name for t in published[-1]} == EXPECTED[7],
                               f"the list after the last event is published: {EXPECTED[7]}")
        reads = list(replay.pod_reads)
        changed.clear()
        # 410 Gone: the client lists again and goes on from the new list
        replay.list_doc = FIXTURE["relist"]
        replay.push(E[7])
        got = await next_list()
        assert set(got) == {"vllm-1", "vllm-3"} and len(replay.lists()) == 2
        # vllm-3's pod declares nothing: the entry's template applies; vllm-1 was not read again
        assert (got["vllm-3"].profile, got["vllm-3"].engine, got["vllm-3"].models) == ("a100", "vllm", ())
        assert replay.pod_reads[len(reads):] == ["vllm-3"]
        assert sorted(set(replay.pod_reads)) == ["vllm-0", "vllm-1", "vllm-2", "vllm-3"]
        await asyncio.wait_for(replay.watching.wait(), 10)
        assert replay.watches()[-1]["resourceVersion"] == "48420"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await replay.close()


async def test_api_errors_keep_the_last_list(tmp_path):
    replay = await K8sReplay(FIXTURE["list"], FIXTURE["pods"]).start()
    entry = DiscoveryConfig(kind="kubernetes", service="vllm", kubeconfig=replay.kubeconfig(str(tmp_path)),
                            namespace="llm")
    published: list[list] = []
    errors = metrics.DISCOVERY_ERRORS.labels("kubernetes:llm/vllm")
    before = errors._value.get()
    # the first retry after 50 ms rather than 1 s, so that three failed rounds take 0.35 s
    task = asyncio.create_task(KubernetesDiscovery(entry, backoff_s=0.05).run(published.append))
    try:
        await asyncio.wait_for(replay.watching.wait(), 10)
        assert [t.name for t in published[-1]] == ["vllm-0"]
        await replay.close()            # the API server goes away mid-watch
        replay.end_watch()
        # the watch fails to reopen, then two relists after their back-offs fail too
        await async_wait_until(lambda: errors._value.get() >= before + 3, "three failed rounds are counted")
        assert len(published) == 1      # nothing published: the last list stands
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_gateway_follows_endpointslices_end_to_end(servers, tmp_path):
    """The gateway process with kubernetes discovery, the replayed API on loopback, and
    simulators at the endpoints' addresses (127.0.0.7 and .8 stand in for pod IPs)."""
    from discovery_helpers import TOKENS, gateway, port_free_on, served, sim_at, status, stream
    from conftest import until
    import openai

    a, b = "127.0.0.7", "127.0.0.8"
    port = port_free_on([a, b])
    sims = {a: sim_at(servers, a, port), b: sim_at(servers, b, port)}
    item = copy.deepcopy(FIXTURE["list"]["items"][0])
    item["ports"][0]["port"] = port
    item["endpoints"][0]["addresses"] = [a]
    item["endpoints"][1]["addresses"] = [b]      # vllm-1: not ready yet
    pods_ = copy.deepcopy(FIXTURE["pods"])
    pods_["vllm-0"]["metadata"]["annotations"] = {}
    pods_["vllm-1"]["metadata"]["labels"]["vlm-gateway.io/profile"] = "l4"
    for p in ("vllm-0", "vllm-1"):
        pods_[p]["metadata"]["annotations"] = {}      # models: asked from the engine
    replay = await K8sReplay({**FIXTURE["list"], "items": [item]}, pods_).start()
    try:
        gw = await asyncio.to_thread(gateway, servers, [
            {"kind": "kubernetes", "service": "vllm", "namespace": "llm", "engine": "sim",
             "kubeconfig": replay.kubeconfig(str(tmp_path))}])
        await asyncio.wait_for(replay.watching.wait(), 10)
        st = await asyncio.to_thread(status, gw)
        assert set(st) == {"vllm-0"}
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
        assert (await stream(client, "first"))[0] == "vllm-0"
        # vllm-1 becomes ready: probed, then routed to
        ready = copy.deepcopy(item)
        ready["endpoints"][1]["conditions"] = {"ready": True, "serving": True, "terminating": False}
        ready["metadata"]["resourceVersion"] = "48230"
        replay.push({"type": "MODIFIED", "object": ready})
        assert await asyncio.to_thread(until, lambda: status(gw).get("vllm-1", {}).get("available"), 10)
        # a stream on vllm-0 is running when vllm-0 starts terminating
        longs = [asyncio.create_task(stream(client, f"long{i}")) for i in range(2)]

        async def one_on_each() -> bool:   # least_loaded spreads the two
            st = await asyncio.to_thread(status, gw)
            return st["vllm-0"]["inflight"] == 1 and st["vllm-1"]["inflight"] == 1
        await async_wait_until(one_on_each, "one long stream in flight on each backend")
        gone = copy.deepcopy(ready)
        gone["endpoints"][0]["conditions"] = {"ready": False, "serving": True, "terminating": True}
        gone["metadata"]["resourceVersion"] = "48340"
        replay.push({"type": "MODIFIED", "object": gone})
        assert await asyncio.to_thread(until, lambda: status(gw)["vllm-0"]["departing"], 10)
        n0 = await asyncio.to_thread(served, sims[a])
        assert {(await stream(client, f"n{i}"))[0] for i in range(3)} == {"vllm-1"}
        assert await asyncio.to_thread(served, sims[a]) == n0
        done = await asyncio.gather(*longs)
        assert {d[0] for d in done} == {"vllm-0", "vllm-1"}
        for i, (backend, text, finish) in enumerate(done):
            assert finish == "length" and text.split()[0] == f"long{i}" and len(text.split()) == TOKENS
        assert await asyncio.to_thread(until, lambda: "vllm-0" not in status(gw), 10)
        await client.close()
    finally:
        await replay.close()
