"""Loading the original file formats: streaming, normalisation, bad files, the disk cache."""

from __future__ import annotations

import json

import pytest

import twice_envs
from tests.envs._webshop_data import PRODUCTS, write_shop
from twice_envs.envs.webshop import catalogue_gen
from twice_envs.envs.webshop.catalogue import iter_json_array, parse_pricing
from twice_envs.envs.webshop.resources import clear_process_cache, load_catalogue
from twice_envs.errors import DataFormatError


def test_streaming_parser_small_chunks(tmp_path):
    items = [{"a": i, "s": "x]" * i, "n": [1, {"b": "}"}]} for i in range(50)]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(items, indent=2))
    got = [v for _, v in iter_json_array(path, chunk_chars=7)]
    assert got == items
    lines = [line for line, _ in iter_json_array(path, chunk_chars=5)]
    assert lines[0] == 2 and lines == sorted(lines)


@pytest.mark.parametrize(
    "text, where, problem",
    [
        ('{"a": 1}', 1, "must start with '['"),
        ('[\n{"a": 1},\n{"a": ', 3, "invalid JSON"),
        ('[\n{"a": 1}\n{"b": 2}]', 3, "expected ',' or ']'"),
        ('[{"a": 1},', 1, "not closed"),
    ],
)
def test_streaming_parser_errors(tmp_path, text, where, problem):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(DataFormatError) as e:
        list(iter_json_array(path, chunk_chars=4))
    assert e.value.line == where and problem in e.value.problem and e.value.path == str(path)


def test_parse_pricing():
    assert parse_pricing("$12.99") == ((12.99,), "$12.99")
    assert parse_pricing("$10.00 - $20.00") == ((10.0, 20.0), "$10.0 to $20.0")
    assert parse_pricing("$1,299.00") == ((1299.0,), "$1299.0")
    assert parse_pricing(None) == ((100.0,), "$100.0")
    assert parse_pricing("") == ((100.0,), "$100.0")
    for bad in ("$", "12.99", "$1.2.3", "$10 - $"):
        with pytest.raises(DataFormatError):
            parse_pricing(bad)


def test_normalisation(tmp_path):
    cat, index, _ = load_catalogue(**_files(tmp_path))
    assert [p.asin for p in cat.products] == ["B0TESTAAA1", "B0TESTBBB2", "B0TESTCCC3"]  # 'nan' and duplicate skipped
    a, b, c = cat.products
    assert a.options == (("color", ("navy | blue", "red")), ("size", ("small", "large")))
    assert a.query == "shampoo" and b.bullets == ("one bullet",)
    assert c.attributes == ("DUMMY_ATTR",) and c.price_tag == "$100.0"
    assert index.search("hammer") == (2,)


def _files(tmp_path):
    kw = write_shop(tmp_path)
    return {"products_path": kw["products_path"], "attributes_path": kw["attributes_path"], "cache_root": kw["cache_root"]}


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda p: p[0].pop("name"), "missing the field 'name'"),
        (lambda p: p[1].update(pricing="$"), "malformed amount"),
        (lambda p: p[1].update(pricing="$5 - $x"), "malformed amount"),
        (lambda p: p[1].update(pricing=12), "'pricing' must be text"),
        (lambda p: p[0].update(customization_options={"color": [{"image": None}]}), "without a text 'value'"),
        (lambda p: p[0].update(small_description=3), "'small_description'"),
        (lambda p: p.__setitem__(0, "not an object"), "must be a JSON object"),
        (lambda p: p[0].update(asin=5), "'asin' must be text"),
    ],
)
def test_bad_product_files(tmp_path, mutate, problem):
    products = json.loads(json.dumps(PRODUCTS))
    mutate(products)
    kw = write_shop(tmp_path, products=products)
    with pytest.raises(DataFormatError) as e:
        twice_envs.make("WebShop-v0", **kw)
    assert problem in str(e.value) and "items.json" in str(e.value)
    assert e.value.line is not None


def test_bad_attribute_and_human_files(tmp_path):
    kw = write_shop(tmp_path, attributes={"B0TESTAAA1": {"attributes": "not a list"}})
    with pytest.raises(DataFormatError, match="list of strings"):
        twice_envs.make("WebShop-v0", **kw)
    kw = write_shop(tmp_path / "h", human={"B0TESTAAA1": [{"no": "instruction"}]})
    with pytest.raises(DataFormatError, match="needs a text 'instruction'"):
        twice_envs.make("WebShop-v0", human_path=str(tmp_path / "h" / "human.json"), **kw)
    (tmp_path / "broken.json").write_text("{\n oops")
    with pytest.raises(DataFormatError) as e:
        twice_envs.make("WebShop-v0", products_path=kw["products_path"], attributes_path=str(tmp_path / "broken.json"),
                        cache_root=kw["cache_root"])
    assert e.value.line == 2


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="products file not found"):
        twice_envs.make("WebShop-v0", products_path=str(tmp_path / "nope.json"))


def test_disk_cache_reload_and_invalidation(tmp_path):
    kw = write_shop(tmp_path)
    env = twice_envs.make("WebShop-v0", **kw)
    assert twice_envs.make("WebShop-v0", **kw).res is env.res  # per-process cache
    clear_process_cache()
    (cache_dirs := list((tmp_path / "cache").iterdir()))
    assert len(cache_dirs) == 1 and (cache_dirs[0] / "manifest.json").exists()
    env2 = twice_envs.make("WebShop-v0", **kw)  # from the disk cache
    assert env2.res is not env.res
    assert [env2.res.goals[i] for i in range(len(env2.res.goals))] == [env.res.goals[i] for i in range(len(env.res.goals))]
    # a changed file gets a new cache entry
    products = json.loads(json.dumps(PRODUCTS))
    products[1]["name"] = "Zen Shampoo Refill Bag"
    write_shop(tmp_path, products=products)
    clear_process_cache()
    env3 = twice_envs.make("WebShop-v0", **kw)
    assert env3.res.catalogue[1].title == "Zen Shampoo Refill Bag"
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_num_products_takes_the_file_prefix(tmp_path):
    kw = write_shop(tmp_path)
    env = twice_envs.make("WebShop-v0", num_products=2, **kw)
    assert len(env.res.catalogue) == 2


def test_generator_is_deterministic_and_loadable(tmp_path):
    a = catalogue_gen.generate(60, seed=3)
    assert a == catalogue_gen.generate(60, seed=3)
    assert a != catalogue_gen.generate(60, seed=4)
    products, attrs = a
    assert len({p["asin"] for p in products}) == 60
    assert all(len(p["asin"]) == 10 and p["asin"][:2] == "B0" for p in products)
    # every character after 'B0' varies from product to product (ids that share a long prefix
    # read alike on a results page)
    assert all(len({p["asin"][k] for p in products}) >= 15 for k in range(2, 10))
    assert {p["category"] for p in products} == set(catalogue_gen.CATEGORIES)
    p_path, a_path = catalogue_gen.write(tmp_path, 60, 3)
    env = twice_envs.make("WebShop-v0", products_path=str(p_path), attributes_path=str(a_path),
                          cache_root=str(tmp_path / "c"))
    assert len(env.res.catalogue) == 60
    gen = twice_envs.make("WebShop-v0", num_products=60, catalogue_seed=3)
    assert len(env.res.goals) == len(gen.res.goals)
    assert env.res.goals[7] == gen.res.goals[7]  # same data from the files and from memory


def test_attribute_and_human_errors_name_their_file_and_entry_line(tmp_path):
    from tests.envs._webshop_data import ATTRIBUTES, HUMAN

    kw = write_shop(tmp_path)
    asins = list(ATTRIBUTES)
    bad = {**ATTRIBUTES, asins[-1]: {"attributes": ["ok"], "instruction": 7}}
    attr_path = tmp_path / "ins_indented.json"
    attr_path.write_text(json.dumps(bad, indent=1), encoding="utf-8")
    expected = next(n for n, l in enumerate(attr_path.read_text().splitlines(), 1) if f'"{asins[-1]}"' in l)
    assert expected > 1
    with pytest.raises(DataFormatError, match="instruction of .* must be text") as e:
        twice_envs.make("WebShop-v0", products_path=kw["products_path"], attributes_path=str(attr_path),
                        cache_root=str(tmp_path / "cache2"))
    assert e.value.path == str(attr_path) and e.value.line == expected

    human = {**{k: v for k, v in HUMAN.items()}, "B0TESTZZZ9": [{"instruction": "x", "instruction_options": "nope"}]}
    human_path = tmp_path / "human_indented.json"
    human_path.write_text(json.dumps(human, indent=1), encoding="utf-8")
    expected = next(n for n, l in enumerate(human_path.read_text().splitlines(), 1) if '"B0TESTZZZ9"' in l)
    with pytest.raises(DataFormatError, match="instruction_options") as e:
        twice_envs.make("WebShop-v0", human_path=str(human_path), **kw)
    assert e.value.path == str(human_path) and e.value.line == expected


@pytest.mark.parametrize("n, batch", [(1, 2000), (57, 10), (230, 7)])
def test_generator_streams_the_original_file_format(tmp_path, n, batch):
    # written a batch at a time, the files are byte for byte json.dumps of the whole lists: one
    # JSON array of products, one object asin -> attributes
    products, attrs = catalogue_gen.generate(n, seed=2)
    p_path, a_path = catalogue_gen.write(tmp_path, n, 2, batch=batch)
    assert p_path.read_text() == json.dumps(products) and a_path.read_text() == json.dumps(attrs)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([p_path.name, a_path.name])  # no temp file left
    assert [v for _, v in iter_json_array(p_path, chunk_chars=64)] == products
    assert list(catalogue_gen.iter_products(n, 2)) == [(p, attrs[p["asin"]]) for p in products]
