// Playground and status page of vlm-gateway. Plain browser JavaScript, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { image: null, kind: "image", auth: false, statusTimer: null };

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = $("key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function api(path, opts) {
  const r = await fetch(path, Object.assign({}, opts, { headers: headers((opts || {}).headers) }));
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((body.error && body.error.message) || ("HTTP " + r.status));
  return body;
}

function fmtBytes(n) {
  if (n == null) return "–";
  if (n < 1024) return n + " B";
  if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1024 / 1024).toFixed(2) + " MiB";
}
const fmtInt = (n) => (n == null ? "–" : Number(n).toLocaleString("en-US"));
const pct = (a, b) => (b ? Math.round((1 - a / b) * 100) : 0);

function showError(msg) { $("error").textContent = msg || ""; }

// -- tabs ------------------------------------------------------------------------------
function showTab() {
  const name = location.hash === "#status" ? "status" : "playground";
  for (const v of ["playground", "status"]) {
    $(v).hidden = v !== name;
    $("tab-" + v).classList.toggle("active", v === name);
  }
  clearInterval(state.statusTimer);
  if (name === "status") {
    refreshStatus();
    state.statusTimer = setInterval(refreshStatus, 2000);
  }
}

// -- image input -------------------------------------------------------------------------
// The question's default follows the media kind, until the user writes one of their own.
const DEFAULT_QUESTION = {
  image: "Describe this image in one sentence.",
  video: "Describe what happens in this video in one sentence.",
};

function showKind(kind) {
  state.kind = kind;
  const video = kind === "video";
  const q = $("question");
  if (Object.values(DEFAULT_QUESTION).includes(q.value.trim())) q.value = DEFAULT_QUESTION[kind];
  for (const side of ["before", "after"]) {
    $("img-" + side).hidden = video;
    $("video-" + side).hidden = !video;
  }
  for (const el of document.querySelectorAll(".video-only")) el.hidden = !video;
  for (const el of document.querySelectorAll(".image-only")) el.hidden = video;
  for (const side of ["before", "after"]) {
    $("tokens-label-" + side).textContent = video ? "Video tokens" : "Visual tokens";
    $("tokens-label-" + side).title = video ? "everything the video adds to the prompt (x-vlm-gateway-video-tokens)" : "";
  }
  $("detail").disabled = video;
}

function takeFile(file) {
  const kind = file && file.type.startsWith("video/") ? "video" : file && file.type.startsWith("image/") ? "image" : null;
  if (!kind) { showError("Not an image or video file"); return; }
  const reader = new FileReader();
  reader.onload = () => {
    state.image = reader.result;
    showKind(kind);
    $("img-after").removeAttribute("src");
    $("video-after").removeAttribute("src");
    $("bytes-before").textContent = fmtBytes(file.size);
    for (const id of ["size-before", "tokens-before", "size-after", "bytes-after", "tokens-after", "frames-before", "frames-after"]) $(id).textContent = "–";
    $("saving").textContent = "";
    if (kind === "video") {
      $("video-before").src = state.image;
      $("drop-hint").textContent = `loaded a video, ${fmtBytes(file.size)}`;
    } else {
      $("img-before").src = state.image;
      $("img-before").onload = () => {
        const i = $("img-before");
        $("drop-hint").textContent = `loaded ${i.naturalWidth} × ${i.naturalHeight}, ${fmtBytes(file.size)}`;
      };
    }
    $("run").disabled = false;
    showError("");
  };
  reader.readAsDataURL(file);
}

function fillFacts(side, info) {
  $("size-" + side).textContent = info.width + " × " + info.height + (info.format ? " " + info.format.toUpperCase() : "");
  $("bytes-" + side).textContent = fmtBytes(info.bytes);
  $("tokens-" + side).textContent = fmtInt(info.tokens);
  $("tokens-" + side).dataset.value = info.tokens;
  $("bytes-" + side).dataset.value = info.bytes;
}

// -- rewrite + streamed answer ------------------------------------------------------------
async function run(ev) {
  ev.preventDefault();
  if (!state.image) return;
  showError("");
  $("run").disabled = true;
  $("answer").textContent = "";
  $("answer-meta").textContent = "";
  $("answer-state").textContent = "";
  const model = $("model").value;
  const detail = $("detail").value;
  try {
    if (state.kind === "video") {
      await runVideo(model);
      await ask(model, detail);
      return;
    }
    const rw = await api("/ui/api/rewrite", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ image: state.image, model, detail }),
    });
    fillFacts("before", rw.before);
    fillFacts("after", rw.after);
    $("img-after").src = rw.image;
    $("saving").textContent = rw.rewritten
      ? `Visual tokens ${fmtInt(rw.before.tokens)} → ${fmtInt(rw.after.tokens)} (−${pct(rw.after.tokens, rw.before.tokens)}%), ` +
        `bytes ${fmtBytes(rw.before.bytes)} → ${fmtBytes(rw.after.bytes)} (−${pct(rw.after.bytes, rw.before.bytes)}%), rewritten in ${rw.rewrite_ms} ms`
      : "Sent unchanged" + (rw.reason ? ": " + rw.reason : " (already within the image budget)");
    if (rw.conversions && rw.conversions.length) {
      $("saving").textContent += ` · converted for the engine: ${rw.conversions.join(", ")}`;
    }
    const b = rw.image_budget;
    if (b) {
      const what = b.class === "no_text" ? "no text found"
        : b.class === "unmeasured" ? "fixed long side"
        : `${b.class === "dense_text" ? "dense (CJK-like) text" : "text"} ~${b.text_px} px, legible from ${b.legible_floor} px`;
      $("saving").textContent += ` · budget: long side ${b.long_side} (${what}; ${b.reason})`;
    }
    await ask(model, detail);
  } catch (e) {
    showError(e.message);
  } finally {
    $("run").disabled = false;
  }
}

// A video: the gateway's video rewrite (frames sampled, duplicates dropped, downscaled)
async function runVideo(model) {
  const rw = await api("/ui/api/rewrite-video", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ video: state.image, model }),
  });
  const b = rw.before || {}, a = rw.after || {};
  for (const [side, info] of [["before", b], ["after", a]]) {
    $("size-" + side).textContent = info.width ? `${info.width} × ${info.height}` : "–";
    $("bytes-" + side).textContent = fmtBytes(info.bytes);
    $("bytes-" + side).dataset.value = info.bytes;
    $("tokens-" + side).textContent = fmtInt(info.tokens);
    $("tokens-" + side).dataset.value = info.tokens == null ? "" : info.tokens;
  }
  // before: what the engine would sample from the source (its own rate is the source's fps);
  // after: the rewritten video's frames and rate (the engine samples every one)
  $("frames-before").textContent = b.frames == null ? "–"
    : `${b.frames} sampled by the engine` + (b.rate ? ` · source ${b.rate} fps` : "") +
      (b.seconds ? `, ${Number(b.seconds).toFixed(1)} s` : "");
  $("frames-after").textContent = a.frames == null ? "–" : `${a.frames} at ${a.rate} fps`;
  if (!rw.rewritten) {
    $("saving").textContent = "Sent unchanged" + (rw.reason ? ": " + rw.reason : "");
    return;
  }
  $("frames-after").textContent += ` · ${rw.states} screen state${rw.states === 1 ? "" : "s"} kept`;
  $("video-after").src = rw.video;
  $("saving").textContent = (b.tokens ? `Prompt tokens of the video ${fmtInt(b.tokens)} → ${fmtInt(a.tokens)} (−${pct(a.tokens, b.tokens)}%), `
    : `Prompt tokens of the video ${fmtInt(a.tokens)}, `) +
    `frames ${b.frames} → ${a.frames}, bytes ${fmtBytes(b.bytes)} → ${fmtBytes(a.bytes)}, ` +
    `${rw.outcome === "l1_hit" ? "from the L1 cache" : "rewritten in " + rw.rewrite_ms + " ms"} (plan ${rw.plan})`;
}

async function ask(model, detail) {
  const image_url = { url: state.image };
  if (detail !== "auto") image_url.detail = detail;
  const media = state.kind === "video"
    ? { type: "video_url", video_url: { url: state.image } }
    : { type: "image_url", image_url };
  const body = {
    model, stream: true, stream_options: { include_usage: true },
    max_tokens: parseInt($("max-tokens").value, 10) || 64,
    messages: [{ role: "user", content: [
      { type: "text", text: $("question").value },
      media,
    ] }],
  };
  const t0 = performance.now();
  $("answer-state").textContent = "waiting…";
  const r = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify(body),
  });
  if (!r.ok) {
    const err = await r.json().catch(() => ({}));
    throw new Error((err.error && err.error.message) || ("HTTP " + r.status));
  }
  if (state.kind === "image") showFrame(r.headers.get("x-vlm-gateway-image-transform-1"), r.headers.get("x-vlm-gateway-grounding"));
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "", ttft = null, usage = null, chunks = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const evt = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of evt.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        const obj = JSON.parse(data);
        if (obj.error) throw new Error(obj.error.message);
        if (obj.usage) usage = obj.usage;
        const delta = obj.choices && obj.choices[0] && obj.choices[0].delta;
        if (delta && delta.content) {
          if (ttft === null) { ttft = performance.now() - t0; $("answer-state").textContent = "streaming…"; }
          $("answer").textContent += delta.content;
          chunks++;
        }
      }
    }
  }
  const total = performance.now() - t0;
  $("answer-state").textContent = "done";
  $("answer").dataset.chunks = chunks;
  const parts = [
    `first token ${ttft === null ? "–" : ttft.toFixed(0) + " ms"}`, `total ${total.toFixed(0)} ms`, `${chunks} chunks`,
    `backend ${r.headers.get("x-vlm-gateway-backend") || "?"}`,
    `gateway overhead ${r.headers.get("x-vlm-gateway-overhead-ms") || "?"} ms`,
  ];
  if (usage) parts.push(`prompt tokens ${usage.prompt_tokens}, completion tokens ${usage.completion_tokens}`);
  const vt = r.headers.get("x-vlm-gateway-video-tokens");
  if (vt) parts.push(`video tokens ${vt.replace(";", ", ")}`);
  $("answer-meta").textContent = parts.join(" · ");
}

// The transform header: "part=..; client=WxH; crop=l,t,r,b; sent=WxH; scale=sx,sy[; model=WxH]".
function parseTransform(value) {
  const out = {};
  for (const item of (value || "").split(";")) {
    const [k, v] = item.trim().split("=");
    if (v !== undefined) out[k] = v;
  }
  return out;
}

function showFrame(transform, grounding) {
  const t = parseTransform(transform);
  const el = $("frame-after");
  if (!t.crop) {
    el.textContent = transform ? "unknown (sent as a URL)" : "–";
  } else {
    const [l, tp, rt, b] = t.crop.split(",").map(Number);
    const [cw, ch] = t.client.split("x").map(Number);
    const [sx, sy] = t.scale.split(",").map(Number);
    const whole = l === 0 && tp === 0 && rt === cw && b === ch;
    el.textContent = (whole ? "whole image" : `crop ${l},${tp} → ${rt},${b} of ${cw} × ${ch}`) +
      ` · ×${sx.toFixed(3)} / ×${sy.toFixed(3)}`;
  }
  el.dataset.value = transform || "";
  const g = parseTransform(grounding);
  $("grounding-after").textContent = grounding
    ? `${g.mapping === "on" ? "mapped to your image" : g.mapping === "off" ? "not mapped (" + g.reason + ")" : "mapped where the answer names its image"} · ${g.convention}`
    : "–";
  $("grounding-after").dataset.value = grounding || "";
}

// -- status -------------------------------------------------------------------------------
function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
}

function fillTable(id, rows, render) {
  const tbody = $(id).querySelector("tbody");
  tbody.textContent = "";
  for (const row of rows) {
    const tr = document.createElement("tr");
    render(tr, row);
    tbody.appendChild(tr);
  }
  if (!rows.length) {
    const tr = document.createElement("tr");
    cell(tr, "none yet", "muted");
    tr.firstChild.colSpan = $(id).querySelectorAll("th").length;
    tbody.appendChild(tr);
  }
}

async function refreshStatus() {
  let s;
  try { s = await api("/ui/api/status"); } catch (e) { $("status-time").textContent = e.message; return; }
  $("status-time").textContent = new Date(s.time * 1000).toLocaleTimeString() + " · routing " + s.routing_policy;
  fillTable("backends", s.backends, (tr, b) => {
    const el = b.engine_load || {};
    cell(tr, b.name); cell(tr, b.engine); cell(tr, b.profile || "–");
    cell(tr, b.state, b.state === "ok" ? "ok" : "bad");
    cell(tr, b.capacity ? `${b.inflight} / ${b.capacity}` : String(b.inflight));
    cell(tr, b.load == null ? "–" : (b.load * 100).toFixed(0) + "%");
    cell(tr, el.running == null ? "–" : `${el.running} / ${el.waiting ?? 0}`);
    cell(tr, el.kv_usage == null ? "–" : (el.kv_usage * 100).toFixed(1) + "%");
  });
  const ib = s.image_budget || { pools: [] };
  fillTable("budget", ib.pools, (tr, p) => {
    cell(tr, p.pool);
    cell(tr, `${p.level} / ${p.max_level}`, p.level ? "bad" : "ok");
    cell(tr, p.ttft_ms == null ? "–" : `${p.ttft_ms} ms`);
    cell(tr, `${p.percentile} ${p.target_ms} ms`);
    cell(tr, p.queued ? "yes" : "no");
  });
  fillTable("caches", s.cache, (tr, c) => {
    cell(tr, c.level); cell(tr, fmtInt(c.lookups)); cell(tr, fmtInt(c.hits));
    cell(tr, c.ratio == null ? "–" : (c.ratio * 100).toFixed(1) + "%");
  });
  const vt = s.images.visual_tokens || {};
  const before = vt.before || 0, after = vt.after || 0;
  $("image-totals").textContent = before
    ? `Visual tokens ${fmtInt(before)} → ${fmtInt(after)} (−${pct(after, before)}%) across all rewritten images`
    : "No images rewritten yet";
  fillTable("recent", s.recent, (tr, q) => {
    cell(tr, new Date(q.time * 1000).toLocaleTimeString()); cell(tr, q.route); cell(tr, q.model || "–");
    cell(tr, String(q.status), q.status < 400 ? "ok" : "bad"); cell(tr, q.backend || "–");
    cell(tr, String(q.images ?? 0));
    cell(tr, q.images ? `${fmtInt(q.visual_tokens_before)} → ${fmtInt(q.visual_tokens_after)}` : "–");
    cell(tr, q.cache || "–");
    cell(tr, q.overhead_ms == null ? "–" : q.overhead_ms + " ms");
    cell(tr, q.duration_ms == null ? "–" : q.duration_ms + " ms");
  });
}

// -- start ------------------------------------------------------------------------------------
async function loadModels() {
  try {
    const m = await api("/ui/api/models");
    $("model").textContent = "";
    for (const id of m.models) {
      const o = document.createElement("option");
      o.textContent = id;
      $("model").appendChild(o);
    }
  } catch (e) { showError(e.message); }
}

async function init() {
  const cfg = await fetch("/ui/api/config").then((r) => r.json()).catch(() => ({}));
  state.auth = !!(cfg.auth || cfg.api_auth);
  $("key-box").hidden = !state.auth;
  $("key").value = sessionStorage.getItem("vlmgw-key") || "";
  $("key").addEventListener("change", () => { sessionStorage.setItem("vlmgw-key", $("key").value); loadModels(); });
  $("file").addEventListener("change", (e) => takeFile(e.target.files[0]));
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); takeFile(e.dataTransfer.files[0]); });
  document.addEventListener("paste", (e) => {
    const item = [...(e.clipboardData || {}).items || []].find((i) => i.type.startsWith("image/") || i.type.startsWith("video/"));
    if (item) takeFile(item.getAsFile());
  });
  $("ask").addEventListener("submit", run);
  window.addEventListener("hashchange", showTab);
  showTab();
  await loadModels();
  document.body.dataset.ready = "1";
}

init();
