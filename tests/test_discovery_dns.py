"""DNS discovery end to end: a real DNS server (dnsmasq) on loopback whose records change
during the test, simulators on several loopback addresses (127.0.0.2, .3, ... are all
loopback on Linux), and a gateway that re-resolves the name and moves its traffic.

What must hold: traffic goes to the addresses the name has now; a backend that left takes
no new request, and the streams it was serving finish complete; one that appeared is
probed and routed to; a DNS outage keeps the last list; an emptied name drains the pool.
"""

from __future__ import annotations

import asyncio
import uuid

import httpx
import openai
import pytest

from conftest import until
from discovery_helpers import TOKENS, gateway, metric, port_free_on, served, sim_at, status, stream
from dns_server import DnsServer
from waiting import async_wait_until

pytestmark = pytest.mark.skipif(not DnsServer.available(), reason="dnsmasq is not installed (apt: dnsmasq-base)")


@pytest.fixture
def dnsd(tmp_path):
    d = DnsServer(str(tmp_path))
    d.start()
    try:
        yield d
    finally:
        d.stop()


async def test_a_records_that_change_move_traffic_and_drain_in_flight_streams(servers, dnsd):
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    port = port_free_on(hosts)
    sims = {h: sim_at(servers, h, port) for h in hosts}
    names = {h: f"{h}:{port}" for h in hosts}
    dnsd.set_hosts({"engines.test": hosts[:2]})
    gw = gateway(servers, [{"kind": "dns", "dns_name": "engines.test", "port": port, "engine": "sim",
                            "nameservers": [dnsd.nameserver], "interval_s": 0.2}])
    assert until(lambda: {n for n, b in status(gw).items() if b["available"]} == {names[h] for h in hosts[:2]}, 10)

    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
    # traffic reaches both addresses the name has, and nothing else
    seen = {(await stream(client, f"warm{i}"))[0] for i in range(4)}
    assert seen == {names[h] for h in hosts[:2]}
    assert served(sims[hosts[2]]) == 0

    # streams in flight on .2 and .3; then .3 leaves the name and .4 joins
    tasks = [asyncio.create_task(stream(client, f"s{i}x{uuid.uuid4().hex[:6]}")) for i in range(6)]

    def all_in_flight() -> dict | None:   # least_loaded spreads them over both
        st = status(gw)
        return st if sum(b["inflight"] for b in st.values()) == 6 else None
    before = await async_wait_until(all_in_flight, "all six streams are in flight")
    assert before[names[hosts[1]]]["inflight"] >= 1, before
    dnsd.set_hosts({"engines.test": [hosts[0], hosts[2]]})
    left = names[hosts[1]]

    def moved():
        st = status(gw)
        return left in st and st[left]["departing"] and st.get(names[hosts[2]], {}).get("available")
    assert until(moved, 5), status(gw)
    n3 = served(sims[hosts[1]])
    # new traffic goes to the new set only; the departing backend takes nothing new
    after = [await stream(client, f"after{i}") for i in range(4)]
    assert {b for b, _, _ in after} == {names[hosts[0]], names[hosts[2]]}
    assert served(sims[hosts[1]]) == n3
    # the streams that were running on the departed backend finish, complete
    results = await asyncio.gather(*tasks)
    on_left = [r for r in results if r[0] == left]
    assert on_left, results
    for (backend, text, finish), t in zip(results, tasks):
        assert finish == "length" and len(text.split()) == TOKENS, (backend, text, finish)
    # ... and once idle it is gone from the pool
    assert until(lambda: left not in status(gw), 5), status(gw)
    assert metric(gw, "vlm_gateway_discovery_changes_total", change="added") == 3
    assert metric(gw, "vlm_gateway_discovery_changes_total", change="removed") == 1
    assert metric(gw, "vlm_gateway_backend_inflight", backend=left) == 0   # its series were dropped

    # DNS down: the last list stands (errors counted), traffic flows
    dnsd.stop()
    assert until(lambda: metric(gw, "vlm_gateway_discovery_errors_total") >= 1, 5)
    assert (await stream(client, "outage"))[0] in {names[hosts[0]], names[hosts[2]]}
    assert {n for n, b in status(gw).items() if b["available"]} == {names[hosts[0]], names[hosts[2]]}
    # DNS back with the name gone (NXDOMAIN): an authoritative empty list drains the pool
    dnsd.hosts = {}
    dnsd.start()
    assert until(lambda: not status(gw), 5), status(gw)
    r = httpx.get(gw.url + "/ready", timeout=5)
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_backend"
    await client.close()


async def test_srv_records_bring_their_ports(servers, dnsd):
    a, b = "127.0.0.5", "127.0.0.6"
    pa, pb = port_free_on([a]), port_free_on([b])
    sa, sb = sim_at(servers, a, pa), sim_at(servers, b, pb)
    dnsd.hosts = {"e5.test": [a], "e6.test": [b]}
    dnsd.set_srv([("_vllm._tcp.engines.test", "e5.test", pa)])
    gw = gateway(servers, [{"kind": "srv", "dns_name": "_vllm._tcp.engines.test", "engine": "sim",
                            "nameservers": [dnsd.nameserver], "interval_s": 0.2}])
    assert until(lambda: {n for n, x in status(gw).items() if x["available"]} == {f"e5.test:{pa}"}, 10), status(gw)
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
    assert (await stream(client, "one"))[0] == f"e5.test:{pa}"
    # the SRV set changes: e6 (another port) joins, then e5 leaves
    dnsd.set_srv([("_vllm._tcp.engines.test", "e5.test", pa), ("_vllm._tcp.engines.test", "e6.test", pb)])
    assert until(lambda: {n for n, x in status(gw).items() if x["available"]} == {f"e5.test:{pa}", f"e6.test:{pb}"},
                 10), status(gw)
    dnsd.set_srv([("_vllm._tcp.engines.test", "e6.test", pb)])
    assert until(lambda: set(status(gw)) == {f"e6.test:{pb}"}, 10), status(gw)
    n_a = served(sa)
    got = {(await stream(client, f"two{i}"))[0] for i in range(3)}
    assert got == {f"e6.test:{pb}"} and served(sa) == n_a and served(sb) >= 3
    await client.close()
