"""The engine core shared by offline generation (`LLM`) and the serving workers: requests,
the scheduler (continuous batching, chunked prefill, preemption), the runners, EngineCore."""
