"""Memory peaks per device: the stage's own processes only, each GPU apart (tensor parallelism
puts a shard and a KV cache on every GPU) and summed."""

from __future__ import annotations

from llmopt_bench.measure.memory import MemoryPeaks

GB = 10**9


def test_peaks_per_device_count_only_the_stage_processes():
    peaks = MemoryPeaks(nvml=True, device_baseline_bytes={0: 1 * GB, 1: 1 * GB}, device_peak_bytes={0: 1 * GB, 1: 1 * GB})
    mine, other = {101, 102}, 999
    # TP=2: worker 101 on GPU 0, worker 102 on GPU 1; another user's process on GPU 1
    peaks.update({0: 20 * GB, 1: 30 * GB}, {0: {101: 18 * GB}, 1: {102: 17 * GB, other: 10 * GB}}, mine)
    peaks.update({0: 25 * GB, 1: 26 * GB}, {0: {101: 23 * GB}, 1: {102: 15 * GB}}, mine)
    d = peaks.as_dict()
    assert d["process_peak_bytes_by_device"] == {"0": 23 * GB, "1": 17 * GB}
    assert d["process_peak_bytes"] == 38 * GB  # the largest simultaneous sum, not the sum of peaks (40)
    assert d["device_peak_bytes"] == {"0": 25 * GB, "1": 30 * GB}
    assert d["device_peak_delta_bytes"] == {"0": 24 * GB, "1": 29 * GB}


def test_a_device_nvml_cannot_read_is_skipped():
    peaks = MemoryPeaks(nvml=True, device_peak_bytes={0: 5})
    peaks.update({0: None}, {}, set())
    assert peaks.device_peak_bytes == {0: 5} and peaks.process_peak_bytes is None
