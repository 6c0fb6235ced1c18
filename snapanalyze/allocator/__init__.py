"""The CUDA caching allocator, modelled: its settings and size arithmetic (`settings`), its state machine (pools,
segments, blocks, malloc and free: `state`) and which cached blocks could serve a request (`usable_mask`).

Below both the collector and the analyses: the collector's CPU capture feeds it a program's allocations to write
a real-format snapshot (`collect.cpu`), and the analyses drive it over a recorded trace to check the trace or to
predict other settings (`analyze.trace_replay`, `analyze.whatif`). It reads no snapshot and imports nothing of
the layers above it.
"""
