"""cs336 assignment-2 ("systems") workloads, rewritten as `--step` functions to check the symbolic
tracer against real CUDA memory snapshots (`../shared/data/snapshots/`, issue 14 item 6).

- `kk_model`: kkaitlyn111's assignment-1 TransformerLM, its per-parameter AdamW and its
  cross-entropy (the code behind `kkaitlyn111/cs336-a2-systems`' snapshots);
- `basics_model`: the course's `cs336_basics` BasicsTransformerLM, AdamW and `nn_utils` (used by
  Wedsonlin, MAGMA27 and bcrafton), with bcrafton's einx-style RoPE as an option;
- `steps`: one `FN(device) -> step()` per recorded window; what each window holds is written in
  each function and in docs/validation.md.

Written from the documented architecture and from the allocation order the snapshots show; no
einops/einx (the tracer's environment has neither): their rearranges are the equivalent views,
permutes and copies.
"""
