"""WebShop: a pure-Python reimplementation of the WebShop text environment.

``twice_envs.make("WebShop-v0")`` runs on an embedded generated catalogue; pass
``products_path=``/``attributes_path=``/``human_path=`` to use the original data files.
"""
