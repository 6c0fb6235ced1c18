"""A caching-allocator simulator: the CUDA caching allocator's state machine fed a trace's allocs and frees.

`settings` holds the allocator's settings and size arithmetic, `state` the state machine (pools, segments,
blocks, the malloc and free paths), `trace_replay` drives it over one device's trace — to check it against
the segment events the trace recorded (replay) or to predict what other settings would have done (what-if).
"""
