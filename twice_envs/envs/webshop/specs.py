"""Registers the WebShop env ids (entry points are strings: nothing heavy is imported)."""

from twice_envs.registry import register

_ENTRY = "twice_envs.envs.webshop.env:WebShopEnv"

register(
    "WebShop-v0",
    _ENTRY,
    description="WebShop text mode: search, browse and buy to match an instruction (embedded generated catalogue)",
    max_episode_steps=15,
    override=True,
)
register(
    "WebShopTest-v0",
    _ENTRY,
    kwargs={"split": "test"},
    description="WebShop-v0 sampling goals from the test split (the first 500 goals)",
    max_episode_steps=15,
    override=True,
)
