"""The video rewrite pipeline in process (vlm_gateway/stages/video/): what the engine
will read from the output (checked with OpenCV, the loader vLLM uses), that every
distinct screen state reaches the output at its own time, determinism, and hostile
inputs refused with specific codes in bounded time and memory (measured in a child
process: FFmpeg's allocations are invisible to tracemalloc)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy as np
import pytest

av = pytest.importorskip("av")
cv2 = pytest.importorskip("cv2")

from vlm_gateway import video_tokens as vt  # noqa: E402
import video_corpus as corpus  # noqa: E402
from vlm_gateway.stages.video import dedupe  # noqa: E402
from vlm_gateway.stages.video.errors import VideoError  # noqa: E402
from vlm_gateway.stages.video.plan import plan, plan_groups  # noqa: E402
from vlm_gateway.stages.video.rewrite import rewrite_video  # noqa: E402
from vlm_gateway.stages.video.settings import VideoSettings  # noqa: E402


def opencv_view(data: bytes) -> tuple[int, float, list[np.ndarray]]:
    """What vLLM 0.24's opencv loader sees: frame count, fps, and every frame (RGB)."""
    import cv2.videoio_registry as vr
    cap = cv2.VideoCapture(io.BytesIO(data), vr.getStreamBufferedBackends()[0], [])
    assert cap.isOpened()
    n, fps = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), cap.get(cv2.CAP_PROP_FPS)
    frames = []
    while cap.grab():
        ok, f = cap.retrieve()
        assert ok
        frames.append(cv2.cvtColor(f, cv2.COLOR_BGR2RGB))
    return n, fps, frames


@pytest.fixture(scope="module")
def screen():
    data, times = corpus.screen_recording(24, 640, 360, 10, seed=3)
    return data, times


@pytest.fixture(scope="module")
def motion():
    return corpus.motion_clip(4, 320, 240, 30)


@pytest.mark.parametrize("plan_kind", ["groups", "frames"])
def test_screen_recording_keeps_every_state_at_its_time(screen, plan_kind):
    data, times = screen
    st = VideoSettings(max_long_side=640, plan=plan_kind)
    r = rewrite_video(data, st)
    assert r.plan.kind == plan_kind
    n, fps, frames = opencv_view(r.data)
    # the engine reads exactly the planned frames at the planned rate, and samples all of them
    assert n == r.frames == len(frames)
    assert Fraction(fps).limit_denominator(1000) == r.plan.rate
    assert vt.sample_indices(n, fps) == list(range(n))
    # the token count follows from what OpenCV reports
    assert vt.video_tokens(n, fps, frames[0].shape[1], frames[0].shape[0]).total == r.after.total
    # every state (start time) appears in some output frame
    states = corpus.screen_states(640, 360, len(times), 3)
    thumbs = [dedupe.thumbnail(av.VideoFrame.from_ndarray(s, format="rgb24"), 128) for s in states]

    def which(img):
        from PIL import Image
        img = np.asarray(Image.fromarray(img).resize((640, 360), Image.BICUBIC))
        t = dedupe.thumbnail(av.VideoFrame.from_ndarray(img, format="rgb24"), 128)
        return int(np.argmin([np.abs(t.astype(int) - u).mean() for u in thumbs]))

    shown = [which(f) for f in frames]
    assert set(shown) == set(range(len(times)))
    end = 24.0   # the clip's length

    def on_screen(t):
        return max(i for i, st0 in enumerate(times) if st0 <= t + 1e-9)

    if plan_kind == "frames":
        # each output frame shows the state that was on screen at its own timestamp j / R
        for j, s in enumerate(shown):
            if j == len(shown) - 1 and r.plan.held_past_end:
                assert s == len(times) - 1
            else:
                assert s == on_screen(j / fps), (j, s)
    else:
        # each engine group (frames 2g, 2g+1) shows one state, which was on screen during the
        # group's span [2g / R, (2g + 2) / R): its stamp (2g + 0.5) / R is off by < 3/4 span
        assert len(shown) % 2 == 0 and r.plan.mixed_groups == 0
        for g in range(0, len(shown), 2):
            assert shown[g] == shown[g + 1], g
            lo, hi = g / fps, min((g + 2) / fps, end)
            assert on_screen(lo) <= shown[g] <= on_screen(hi - 1e-6), (g, shown[g], lo, hi)
        # states appear in time order
        assert shown == sorted(shown)
    assert r.plan.states == len(times)
    assert r.after.total < r.before.total


def test_motion_keeps_every_sample_at_the_engine_rate(motion):
    r = rewrite_video(motion, VideoSettings(max_long_side=256))
    assert r.plan.step == 1 and r.plan.rate == 2 and r.frames == 8     # 4 s at 2 fps
    n, fps, frames = opencv_view(r.data)
    assert (n, fps, len(frames)) == (8, 2.0, 8)
    assert (frames[0].shape[1], frames[0].shape[0]) == (r.width, r.height) == (256, 192)
    assert r.frame_times == tuple(j / 2 for j in range(8))
    assert r.before.frames == 8 and r.after.frames == 8      # raw: int(120 / 30 x 2) = 8 samples too


def test_output_is_deterministic(screen):
    a = rewrite_video(screen[0], VideoSettings(max_long_side=640))
    b = rewrite_video(screen[0], VideoSettings(max_long_side=640))
    assert a.data == b.data and a.digest == b.digest


def test_decode_threads_change_no_byte_and_the_auto_setting_takes_the_pools_grant(screen, monkeypatch):
    """FFmpeg's frame threads give the same frames: the output is the same with 1, 3 or the
    grant of a pool job (``decode_threads: 0``, images/spare.py), and the grant is used."""
    from vlm_gateway.stages.images import spare
    from vlm_gateway.stages.video import decode
    used = []
    real = decode.frames
    monkeypatch.setattr(decode, "frames", lambda *a, **k: used.append(k["threads"]) or real(*a, **k))
    outs = {rewrite_video(screen[0], VideoSettings(max_long_side=640, decode_threads=n)).data for n in (1, 3)}
    spare.set_granted(2)
    try:
        outs.add(rewrite_video(screen[0], VideoSettings(max_long_side=640, decode_threads=0)).data)
    finally:
        spare.set_granted(1)
    assert len(outs) == 1 and used == [1, 3, 2]


def test_long_video_halves_the_rate_within_max_frames(motion):
    r = rewrite_video(motion, VideoSettings(max_long_side=128, max_frames=4, dedupe=False))
    assert r.sample_rate == 1 and r.samples == 4 and r.frames == 4


def test_engine_pixel_budget_is_applied_before_sending(motion):
    spec = vt.VideoProcessorSpec(max_pixels=8 * 128 * 96)
    r = rewrite_video(motion, VideoSettings(max_long_side=256, engine=spec))
    assert r.frames * r.width * r.height <= spec.max_pixels
    assert vt.video_smart_resize(r.frames, r.height, r.width, spec) == (r.height, r.width)


def test_plan_step_is_the_shortest_state():
    f = Fraction(2)
    kept = [True, False, False, False, True, False, False, True, False, False, False, False, True]
    p = plan(kept, f, Fraction(1, 10))
    assert p.step == 3 and p.rate == Fraction(2, 3)
    assert p.grid == (0, 3, 6, 9, 12) and p.sources == (0, 0, 4, 7, 12)
    # last state shorter than a step and off the grid: one frame holds it past the end
    p = plan([True, False, False, True, True], f, Fraction(1, 10))
    assert p.step == 1
    p = plan([True, False, False, False, True, False, False, False, True], f, Fraction(1, 10))
    assert p.step == 4 and p.grid == (0, 4, 8)
    p = plan([True, False, False, False, True, False, False, False, False, True], f, Fraction(1, 10))
    assert p.grid == (0, 4, 8, 12) and p.held_past_end and p.sources[-1] == 9
    # min_fps caps the step; a single sample still yields the engine's two frames
    assert plan([True] + [False] * 99, f, Fraction(1, 5)).step == 10
    assert plan([True], f, Fraction(1, 5)).grid == (0, 1)


def test_plan_groups_gives_each_state_a_group_of_its_own():
    f = Fraction(2)
    # states of 4, 3, 5 and 2 samples: m = 1 (2-sample groups) is the largest step that
    # keeps the 3-sample state in a group of its own; the engine's groups never pair two
    kept = [True, False, False, False, True, False, False, True, False, False, False, False, True, False]
    p = plan_groups(kept, f, Fraction(1, 10))
    assert p.kind == "groups" and p.mixed_groups == 0
    assert set(p.sources) == {0, 4, 7, 12}
    assert all(p.sources[j] == p.sources[j + 1] for j in range(0, len(p.sources), 2))
    # two 5 s states: two groups; m = 4 is the smallest step that needs no more (group 1
    # spans 4-8 s and is stamped 5 s, when the second state begins; a third, partial group
    # would only repeat it and is left out); a static 50 s video: min_fps (1/5) keeps the
    # output's length, 10 frames at 0.2 fps
    p = plan_groups([True] + [False] * 9 + [True] + [False] * 9, f, Fraction(1, 10))
    assert p.step == 4 and p.sources == (0, 0, 10, 10) and p.rate == Fraction(1, 2)
    assert plan_groups([True] + [False] * 99, f, Fraction(1, 5)).sources == (0,) * 10
    assert plan_groups([True], f, Fraction(1, 5)).sources == (0, 0)
    # motion (every sample new) cannot keep every state in its own group: the frame plan
    p = plan_groups([True] * 8, f, Fraction(1, 5))
    assert p.kind == "frames" and p.step == 1 and p.sources == tuple(range(8))


def test_plan_groups_properties():
    """Every state shown, in a group of its own, by a group whose span it was on screen in,
    in time order; the frame plan pairs states where the group plan does not."""
    import random
    rng = random.Random(7)
    f = Fraction(2)
    for _ in range(300):
        K = rng.randrange(1, 80)
        kept = [True] + [rng.random() < rng.choice((0.05, 0.2, 0.5)) for _ in range(K - 1)]
        p = plan_groups(kept, f, Fraction(1, 5))
        starts = [k for k, new in enumerate(kept) if new]
        assert set(p.sources) == set(starts)
        assert list(p.sources) == sorted(p.sources)
        assert Fraction(f) / p.rate == p.step and p.rate <= 2
        if p.kind == "groups":
            m = p.step
            assert len(p.sources) % 2 == 0 and p.mixed_groups == 0
            for g in range(0, len(p.sources), 2):
                a = p.sources[g]
                assert p.sources[g + 1] == a
                end = starts[starts.index(a) + 1] if a != starts[-1] else K     # state a: samples [a, end)
                lo, hi = g * m, min((g + 2) * m, K)
                assert a < hi and end > lo, (kept, p)        # on screen during the group's span
        else:
            assert p.step == 1 or p.kind == "frames"


# -- hostile inputs: refused with a code, in bounded time and memory -----------------------------

_CHILD = textwrap.dedent("""
    import json, sys, time
    from vlm_gateway.stages.video.rewrite import rewrite_video
    from vlm_gateway.stages.video.settings import VideoSettings
    from vlm_gateway.stages.video.errors import VideoError

    def kb(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

    data = open(sys.argv[1], "rb").read()
    kw = json.loads(sys.argv[2])
    # the peak from here on: ru_maxrss would carry the forking test process's own peak across exec
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = kb("VmRSS")
    t = time.monotonic()
    try:
        rewrite_video(data, VideoSettings(**kw)); code = None
    except VideoError as e:
        code = e.code
    print(json.dumps({"code": code, "s": time.monotonic() - t, "rss_mib": (kb("VmHWM") - base) / 1024}))
""")


def refuse(tmp_path, data: bytes, **settings) -> dict:
    p = tmp_path / "in.bin"
    p.write_bytes(data)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(p), json.dumps(settings)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name,make,code,settings", [
    ("zip served as video/mp4", corpus.zip_bytes, "unsupported_video_format", {}),
    ("HTML served as video/mp4", lambda: corpus.HTML, "unsupported_video_format", {}),
    ("empty", lambda: b"", "video_empty", {}),
    ("truncated MP4 (index at the end)", lambda: corpus.truncated(corpus.motion_clip(2, 160, 120, 30)),
     "video_corrupt", {}),
    ("truncated MPEG-TS", lambda: corpus.truncated(corpus.encode(corpus.motion_frames(2, 160, 120, 30), 30,
                                                                  fmt="mpegts"), 0.5), None, {}),
    ("huge declared frame size", corpus.huge_frame_size, "video_frame_too_large", {}),
    ("pixel bomb without a frame count", lambda: corpus.pixel_bomb(120, 1920, 1080), "video_too_many_pixels",
     {"max_decoded_pixels": 100_000_000}),
    ("thousands of tiny frames", lambda: corpus.tiny_frames(40_000), "video_too_many_frames", {}),
    ("stream running past the duration limit", lambda: corpus.long_stream(2000), "video_too_long", {}),
    ("over the byte limit", lambda: corpus.motion_clip(1, 160, 120, 30), "video_too_large", {"max_bytes": 1000}),
])
def test_hostile_inputs_are_refused_quickly(tmp_path, name, make, code, settings):
    res = refuse(tmp_path, make(), **settings)
    if code is None:
        # a truncated stream without an index decodes what is there: no crash, a short video
        assert res["code"] is None
    else:
        assert res["code"] == code, (name, res)
    assert res["s"] < 10, (name, res)
    assert res["rss_mib"] < 200, (name, res)


def test_unreferenced_frames_skipped_far_below_the_source_rate(motion):
    """At 4+ source frames per sample the decoder skips frames nothing references (x264's
    B-frames here): fewer frames decoded, the same samples' timeline and token count."""
    skip = rewrite_video(motion, VideoSettings(max_long_side=256))
    full = rewrite_video(motion, VideoSettings(max_long_side=256, skip_nonref=False))
    assert full.decoded_frames == 120 and skip.decoded_frames < 100
    assert (skip.frames, skip.plan.rate, skip.after.total) == (full.frames, full.plan.rate, full.after.total)
    assert skip.frame_times == full.frame_times
    # a source near the sampling rate is decoded whole
    slow = corpus.encode(corpus.motion_frames(4, 160, 120, 6), 6)
    assert rewrite_video(slow, VideoSettings(max_long_side=160)).decoded_frames == 24


@pytest.mark.parametrize("skip", [True, False])
def test_limits_hold_when_frames_are_skipped(tmp_path, skip):
    # 90 s at 30 fps (2700 tiny frames, x264 with B-frames): the duration limit reads packet times
    long30 = corpus.encode(corpus.motion_frames(90, 32, 32, 30), 30, fmt="mpegts", preset="veryfast")
    res = refuse(tmp_path, long30, max_duration_s=60, skip_nonref=skip)
    assert res["code"] == "video_too_long"
    res = refuse(tmp_path, long30, max_source_frames=1000, skip_nonref=skip)
    assert res["code"] == "video_too_many_frames"
    # an MP4 whose index (at the front) declares frames its data no longer holds
    whole = faststart_mp4(tmp_path / "fs.mp4", corpus.motion_frames(4, 160, 120, 30), 30)
    res = refuse(tmp_path, whole[: int(len(whole) * 0.6)], skip_nonref=skip)
    assert res["code"] in ("video_truncated", "video_corrupt"), res


def faststart_mp4(path, frames, fps) -> bytes:
    with av.open(str(path), mode="w", format="mp4", options={"movflags": "faststart"}) as out:
        s = None
        for j, arr in enumerate(frames):
            if s is None:
                s = out.add_stream("libx264", rate=fps, options={"threads": "1", "preset": "veryfast"})
                s.height, s.width = arr.shape[:2]
                s.pix_fmt = "yuv420p"
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            vf.pts = j
            for p in s.encode(vf):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    data = path.read_bytes()
    assert data[4:8] == b"ftyp" and b"moov" in data[:4096]    # the index first
    return data


def test_decode_deadline(tmp_path):
    res = refuse(tmp_path, corpus.pixel_bomb(120, 1920, 1080), max_decode_s=0.05)
    assert res["code"] == "video_decode_timeout" and res["s"] < 5


def test_errors_name_what_the_bytes_are():
    from vlm_gateway.stages.video.probe import sniff
    with pytest.raises(VideoError, match="zip archive"):
        sniff(corpus.zip_bytes())
    with pytest.raises(VideoError, match="HTML"):
        sniff(corpus.HTML)
    with pytest.raises(VideoError, match="image"):
        sniff(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)


# -- containers that declare more than they hold (#32): refused from their own tables -------------

@pytest.mark.parametrize("name", sorted(corpus.hostile_tables()))
def test_declared_counts_and_oversized_frames_are_refused_before_ffmpeg_allocates(tmp_path, name):
    """Before the table checks and the decoders' max_pixels, each cost FFmpeg 150 MB to
    1.4 GB (20 million declared samples: +700 MB inside av.open; a 16000x16000 MJPEG frame
    in a 64x64 stream: +246 MB before the frame check)."""
    data, codes = corpus.hostile_tables()[name]
    res = refuse(tmp_path, data)
    assert res["code"] in codes, (name, res)
    assert res["s"] < 2 and res["rss_mib"] < 64, (name, res)


@pytest.mark.parametrize("kw", [
    {"seconds": 10},                                                          # AAC beside H.264
    {"seconds": 240, "audio": "pcm_s16le", "fmt": "mov", "w": 32, "h": 32, "fps": 1},  # 11.5 M PCM samples
    {"seconds": 120, "fragmented": True, "w": 64, "h": 48, "fps": 5},        # a moof per keyframe
], ids=["aac", "pcm-240s", "fragmented-120s"])
def test_real_sound_tracks_and_fragments_pass_the_table_checks(kw):
    from vlm_gateway.stages.video import tables
    data = corpus.with_audio(**kw)
    tables.check(data, "mp4", VideoSettings())
    r = rewrite_video(data, VideoSettings(max_long_side=64))
    assert r.decoded_frames == int(kw["seconds"] * kw.get("fps", 30))
