"""Qwen3-VL video token rule (vlm_gateway/video_tokens.py) against the formulas of vLLM
0.24 and transformers 5.17 (docs/VIDEO.md): sampling indices against numpy's linspace,
the video smart_resize on worked examples, timestamps, and whole-video totals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vlm_gateway import video_tokens as vt


@pytest.mark.parametrize("total,fps", [(300, 30.0), (1800, 30.0), (7, 0.5), (21, 1 / 3), (5, 25.0), (3, 30.0),
                                       (100000, 30.0), (451, 29.97), (999, 23.976), (20, 2.0), (40, 8.0)])
def test_sample_indices_match_vllm_qwen3_loader(total, fps):
    # vllm/multimodal/video.py Qwen3VLVideoBackend.compute_frames_index_to_sample
    n = int(total / fps * 2)
    n = min(max(n, 4), 768, total)
    want = np.linspace(0, total - 1, n).round().astype(int).tolist()
    assert vt.sample_indices(total, fps) == want


def test_sample_indices_at_rate_at_most_2_take_every_frame():
    # the rewrite's output: R <= 2 fps means the engine samples 1:1
    for n in range(2, 200):
        for r in (2.0, 1.0, 2 / 3, 0.5, 1 / 3, 0.2, 0.1):
            assert vt.sample_indices(n, r) == list(range(n))


def test_video_smart_resize_worked_examples():
    # 10 s 1280x720 at 30 fps: 20 sampled frames; 720/32 = 22.5 rounds half-even to 22
    assert vt.video_smart_resize(20, 720, 1280) == (704, 1280)
    # 60 s 1920x1080: 120 frames; volume 120 x 1088 x 1920 > 25165824 ->
    # beta = sqrt(120 x 1080 x 1920 / 25165824) = 3.1445; floor(1080/beta/32) = 10, floor(1920/beta/32) = 19
    beta = math.sqrt(120 * 1080 * 1920 / 25165824)
    assert (math.floor(1080 / beta / 32) * 32, math.floor(1920 / beta / 32) * 32) == (320, 608)
    assert vt.video_smart_resize(120, 1080, 1920) == (320, 608)
    # tiny frames: volume below 4096 grows; sides under 32 are scaled up first
    assert vt.video_smart_resize(2, 16, 16) == (64, 64)
    with pytest.raises(ValueError):
        vt.video_smart_resize(1, 448, 768)


def test_odd_frame_counts_round_t_bar_half_even():
    # t_bar = round(n / 2) * 2 (Python round, as transformers uses): 5 frames count as 4, so
    # 5 x 448 x 768 over a budget of 4 x 448 x 768 is not resized; 6 frames are
    spec = vt.VideoProcessorSpec(max_pixels=4 * 448 * 768)
    assert vt.video_smart_resize(5, 448, 768, spec) == (448, 768)
    assert vt.video_smart_resize(6, 448, 768, spec) == (352, 608)   # beta = sqrt(6 / 4)


def test_timestamps_average_pairs_and_pad_odd_counts():
    assert vt.group_timestamps([0, 15, 30, 45], 30.0) == [0.25, 1.25]
    assert vt.group_timestamps([0, 1, 2], 0.5) == [1.0, 4.0]          # last frame repeated
    assert vt.timestamp_text(0.25) == "<0.2 seconds>"                  # Python formatting, half-even on binary
    assert vt.timestamp_text(9.75) == "<9.8 seconds>"


def test_qwen_timestamp_tokens():
    assert vt.qwen_timestamp_tokens("<0.2 seconds>") == 6
    assert vt.qwen_timestamp_tokens("<59.5 seconds>") == 7


def test_totals_for_the_two_benchmark_clips():
    motion = vt.video_tokens(300, 30.0, 1280, 720)
    assert (motion.frames, motion.groups, motion.tokens_per_group) == (20, 10, 880)
    # groups at 0.25, 1.25, ... 9.25 s: 10 timestamps of one digit before the point -> 6 tokens each
    assert motion.timestamp_tokens == 60
    assert motion.total == 10 * (880 + 2) + 60
    screen = vt.video_tokens(1800, 30.0, 1920, 1080)
    assert (screen.frames, screen.groups, screen.tokens_per_group) == (120, 60, 190)
    digits = sum(sum(c.isdigit() for c in f"{(i + 0.25):.1f}") for i in range(60))
    assert screen.total == 60 * 192 + 4 * 60 + digits


def test_tokenizer_counter_reads_a_tokenizer_json(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["abc"], tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    count = vt.tokenizer_counter(str(path))
    # no merges cover this text: one token per byte, as the synthetic GPU tokenizer gives
    assert count("<0.5 seconds>") == 13
    v = vt.video_tokens(300, 30.0, 1280, 720, count=count)
    assert v.timestamp_tokens == 10 * 13
