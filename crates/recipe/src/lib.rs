//! DeepSeek V4 / V4.1 protocol layer: requests -> conversation -> prompt, model output -> events.
