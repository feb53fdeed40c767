"""Time as the gateway reads it. A ``Clock`` returns monotonic seconds; the parts that
measure back-offs, deadlines and refills take one (default ``monotonic``), so that
tests can move time by hand instead of sleeping."""

from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], float]
monotonic: Clock = time.monotonic
