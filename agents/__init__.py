"""The LLM agent: keyed samplers, policies, rollouts, twin rollouts, credit and training."""

__all__: list[str] = []
