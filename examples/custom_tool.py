"""Write a replayable tool and plug it into SearchQA: a wrapper around a web-search HTTP API.

A live search engine is nondeterministic (results change, the network fails), so
the tool goes through a journal: the first answer to each (name, version, query, k)
is stored in a SQLite file, and every replay, fork or twin reads it back, even with
the network off. Run it with ``python examples/custom_tool.py`` (it uses a simulated
engine instead of the network).
"""

import itertools
import json
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

import twice_envs
from twice_envs.envs.searchqa import register_search_tool
from twice_envs.tools import Tool, shared_journal


class WebSearch(Tool):
    """``call(query, k)`` -> ``{"passages": ['"Title"\\ntext', ...]}`` from a JSON search API."""

    name = "web_search"
    version = "example-api/1"  # bump it when the API (or what it searches) changes

    def __init__(self, endpoint: str, transport=None):
        self.endpoint = endpoint
        self.transport = transport or self.http_get

    @staticmethod
    def http_get(url: str) -> dict:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)

    def call(self, query: str, k: int) -> dict:
        url = f"{self.endpoint}?{urllib.parse.urlencode({'q': query, 'n': k})}"
        hits = self.transport(url)["results"][:k]
        return {"passages": [f'"{h["title"]}"\n{h["snippet"]}' for h in hits]}


def simulated_engine():
    """Stands in for the network: every call answers a little differently, like a live index."""
    calls = itertools.count()

    def transport(url: str) -> dict:
        q = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)["q"][0]
        n = next(calls)
        return {"results": [{"title": f"{q} ({i})", "snippet": f"result {i} for {q!r}, fetched on call {n}"} for i in range(5)]}

    return transport


def network_off(url: str) -> dict:
    raise ConnectionError("the network is off")


def main(workdir: Path) -> None:
    journal = str(workdir / "web_search.sqlite")
    web = WebSearch("https://search.invalid/api", transport=simulated_engine())
    register_search_tool("web", lambda resources: web)  # resources: the env's corpus, questions, ...
    env = twice_envs.make("SearchQA-v0", search_tool="web", journal=journal)

    env.reset(seed=3)
    env.step("<think> look it up </think>\n<search> fictional harbour towns </search>")
    env.step("<search> who founded the harbour </search>")
    print(env.trajectory.observations[1].strip()[:90], "...")

    # Network off, memory cache dropped: the SQLite journal alone answers replays and forks.
    web.transport = network_off
    shared_journal(journal).clear_memory()
    again = twice_envs.replay(env.trajectory, trusted=True)  # our own record: its journal path is ours
    print("replay identical with the network off:", again.trajectory.digests == env.trajectory.digests)
    branch = env.fork(1)
    branch.step("<search> who founded the harbour </search>")
    print("fork reads the journal:", branch.trajectory.observations[2] == env.trajectory.observations[2])
    _, _, _, _, info = branch.step("<search> a query nobody asked before </search>")
    print("a new query with the network off fails softly:", info["tool_error"])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(Path(tmp))
