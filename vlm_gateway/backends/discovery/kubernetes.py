"""kubernetes: the ready endpoints of a Service's EndpointSlices, list + watch.

    list   GET  /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices
                ?labelSelector=kubernetes.io/service-name=SERVICE          -> SliceSet.reset
    watch  the same with watch=1, resourceVersion, allowWatchBookmarks,
           timeoutSeconds=WATCH_TIMEOUT_S                                    -> SliceSet.apply
           a watch that ends is resumed from the last resourceVersion; 410 Gone (history
           compacted) relists; other errors back off (BACKOFF_S doubling to MAX_BACKOFF_S) and relist,
           the last published list standing meanwhile
    pods   GET /api/v1/namespaces/NS/pods/NAME of each endpoint's targetRef (cached by uid):
           ``vlm-gateway.io/profile`` and ``vlm-gateway.io/engine`` from an annotation or a
           label, ``vlm-gateway.io/models`` (comma-separated) from an annotation; absent keys
           fall back to the discovery entry's template. A pod's metadata is read once per uid
           (a relabelled pod keeps its first reading until it is replaced).

Target names are pod names (``targetRef.name``), else ``address:port``. RBAC: ``get``,
``list``, ``watch`` on ``endpointslices`` (discovery.k8s.io) and ``get`` on ``pods``
(``read_pods: false`` skips the pod reads). Uses kubernetes-asyncio (the ``kubernetes``
extra). The selection rules are in ``slices.py``; both are tested against recorded watch
streams replayed on loopback, never against a live API server.
"""

from __future__ import annotations

import asyncio
import logging

from ... import metrics
from .slices import Endpoint, SliceSet
from .source import Discovery, Publish, Target, hostport, target

log = logging.getLogger("vlm_gateway.discovery")

WATCH_TIMEOUT_S = 300
BACKOFF_S, MAX_BACKOFF_S = 1.0, 30.0
KEY = "vlm-gateway.io/"
ENGINES = ("vllm", "trtllm", "sim", "openai")
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def own_namespace() -> str:
    try:
        with open(SA_NAMESPACE, encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def pod_overrides(labels: dict | None, annotations: dict | None) -> dict:
    """profile / engine / models a pod declares (annotation first, then label)."""
    labels, annotations = labels or {}, annotations or {}
    out: dict = {}
    for k in ("profile", "engine"):
        v = annotations.get(KEY + k) or labels.get(KEY + k)
        if v:
            out[k] = v
    if out.get("engine") not in (None, *ENGINES):
        log.warning("pod declares engine %r, not one of %s; ignored", out.pop("engine"), ", ".join(ENGINES))
    models = annotations.get(KEY + "models")
    if models:
        out["models"] = tuple(m.strip() for m in models.split(",") if m.strip())
    return out


class KubernetesDiscovery(Discovery):
    def __init__(self, entry, backoff_s: float = BACKOFF_S) -> None:
        self.entry = entry
        self.backoff_s = backoff_s  # the first retry's wait after an API error
        self.namespace = entry.namespace or own_namespace()
        self.label = f"kubernetes:{self.namespace}/{entry.service}"
        self.slices = SliceSet(entry.port_name)
        self._pods: dict[str, dict] = {}      # pod uid (or name) -> overrides
        self._last: list[Target] | None = None
        self._pod_read_denied = False

    async def _api_client(self):
        from kubernetes_asyncio import client, config
        conf = client.Configuration()
        if self.entry.kubeconfig:
            await config.load_kube_config(config_file=self.entry.kubeconfig, client_configuration=conf)
        else:
            try:
                config.load_incluster_config(client_configuration=conf)
            except config.ConfigException:
                await config.load_kube_config(client_configuration=conf)
        return client.ApiClient(configuration=conf)

    async def run(self, publish: Publish) -> None:
        from kubernetes_asyncio import client, watch
        from kubernetes_asyncio.client.exceptions import ApiException
        import aiohttp

        api_client = await self._api_client()
        try:
            disc, core = client.DiscoveryV1Api(api_client), client.CoreV1Api(api_client)
            selector = f"kubernetes.io/service-name={self.entry.service}"
            backoff = self.backoff_s
            while True:
                try:
                    lst = await disc.list_namespaced_endpoint_slice(self.namespace, label_selector=selector)
                    raw = api_client.sanitize_for_serialization(lst)
                    self.slices.reset(raw.get("items") or [], (raw.get("metadata") or {}).get("resourceVersion", ""))
                    await self._publish(core, publish)
                    backoff = self.backoff_s
                    while True:   # one watch per round; resumed from the last resourceVersion
                        async with watch.Watch().stream(
                                disc.list_namespaced_endpoint_slice, self.namespace, label_selector=selector,
                                resource_version=self.slices.resource_version, allow_watch_bookmarks=True,
                                timeout_seconds=WATCH_TIMEOUT_S) as stream:
                            async for ev in stream:
                                if self.slices.apply(ev["type"], ev["raw_object"]):
                                    await self._publish(core, publish)
                except ApiException as e:
                    if e.status == 410:
                        log.info("discovery %s: watch history expired (410); listing again", self.label)
                        continue
                    self._failed(f"API error {e.status} {e.reason}", backoff)
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError) as e:
                    self._failed(f"{type(e).__name__}: {e}", backoff)
                else:
                    continue
                await asyncio.sleep(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
        finally:
            await api_client.close()

    def _failed(self, why: str, backoff: float) -> None:
        metrics.DISCOVERY_ERRORS.labels(self.label).inc()
        log.warning("discovery %s: %s; keeping %d backend(s), retrying in %g s", self.label, why,
                    len(self._last or []), backoff)

    async def _pod(self, core, ep: Endpoint) -> dict:
        key = ep.pod_uid or ep.pod
        if not ep.pod or not self.entry.read_pods or self._pod_read_denied:
            return {}
        if key in self._pods:
            return self._pods[key]
        from kubernetes_asyncio.client.exceptions import ApiException
        try:
            pod = await core.read_namespaced_pod(ep.pod, self.namespace)
        except ApiException as e:
            if e.status == 403:
                self._pod_read_denied = True
                log.warning("discovery %s: no permission to read pods; using the entry's profile and "
                            "engine for every endpoint (grant `get` on pods, or set read_pods: false)",
                            self.label)
            return {}   # 404: the pod is already gone; the endpoint will follow
        got = pod_overrides(pod.metadata.labels, pod.metadata.annotations)
        self._pods[key] = got
        return got

    async def targets(self, core) -> list[Target]:
        out = []
        for ep in self.slices.endpoints():
            over = await self._pod(core, ep)
            out.append(target(self.entry, ep.address, ep.port, name=ep.pod or hostport(ep.address, ep.port), **over))
        live = {ep.pod_uid or ep.pod for ep in self.slices.endpoints()}
        for k in [k for k in self._pods if k not in live]:
            del self._pods[k]
        return out

    async def _publish(self, core, publish: Publish) -> None:
        now = await self.targets(core)
        if now != self._last:
            self._last = now
            publish(now)
