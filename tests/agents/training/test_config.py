"""The published training settings (the paper's Table 6)."""

from twice_envs.agents.training.config import published_config
from twice_envs.agents.training.trainer import _lr_lambda


def test_published_run_is_400_updates_with_a_20_update_warm_up():
    cfg = published_config()
    assert cfg.updates == 400
    assert (cfg.questions_per_update, cfg.group_size, cfg.lr, cfg.minibatches) == (256, 5, 1e-6, 4)
    # the scheduler steps once per minibatch: 4 steps per update, full rate from update 21 on
    lr = _lr_lambda(cfg.warmup_steps)
    assert cfg.warmup_steps == 80
    assert lr(4 * 20 - 2) < 1.0 and lr(4 * 20 - 1) == 1.0
    # the branching warm-up is a separate setting: q = 0.3 for 10 updates
    assert (cfg.twice.warmup_updates, cfg.twice.warmup_q) == (10, 0.3)


def test_published_warm_up_follows_the_minibatches_unless_given():
    assert published_config(minibatches=2).warmup_steps == 40
    assert published_config(minibatches=2, warmup_steps=7).warmup_steps == 7
    assert published_config(updates=5).updates == 5
