"""The training of the embedded `tiny-trained` model (tools/train_tiny.py is the command line):
`corpus` (the standard library, tokenized and split), `target` (the backbone, trained through
transformers' DeepseekV4ForCausalLM), `drafter` (the DSpark drafter, target frozen), `evaluate`
(held-out perplexity, the greedy draft-and-verify loop, confidence calibration)."""
