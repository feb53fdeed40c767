"""VideoError: a refusal with a specific ``code``; the stage turns it into a 400 that
names the part (``messages[i].content[j].video_url``) and carries the code.

Codes: video_empty, unsupported_video_format, unsupported_video_codec, video_too_large,
video_corrupt, video_truncated, video_no_stream, video_too_long, video_too_many_frames,
video_frame_too_large, video_too_many_pixels, video_decode_timeout, video_aspect_ratio,
video_unavailable (no decoder installed: the operator must fix it; still a 400, which no SDK
retries, naming the command that installs it).
"""

from __future__ import annotations


class VideoError(ValueError):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
