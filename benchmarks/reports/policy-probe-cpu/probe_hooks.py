"""What trace.py and probe7_g0.py log of one policy decision (diagnostics, not the package)."""


def plan_record(P, batch, costs, stats, bounds, plan, tokens_digits=2, seconds_digits=4):
    """The batch, every arm's (expected tokens, seconds) and the plan chosen, as a log entry;
    ``P``: vllm_mtad.core.policy (as the caller imported it, before patching it)."""
    arms = {}
    for w, g in P.arms(bounds, batch):
        tok = P.expected_tokens(batch, stats, w, g)
        arms[f"W{w}g{g}"] = (round(tok, tokens_digits),
                             round(tok / P.goodput(batch, costs, stats, w, g), seconds_digits))
    return {"kind": "plan", "B": batch.size, "other": batch.other_tokens,
            "first": batch.first_pass_tokens, "catch": batch.catch_up_tokens,
            "left": batch.remaining_tokens, "plan": f"W{plan.beam_width}g{plan.num_tokens}",
            "explore": plan.explore, "owed_s": round(costs.owed_time(batch), seconds_digits),
            "arms": arms}
