"""A three-product shop in the original file formats, for the WebShop tests."""

from __future__ import annotations

import json
from pathlib import Path

PRODUCTS = [
    {
        "asin": "B0TESTAAA1",
        "name": "Acme Lavender Shampoo Bottle",
        "full_description": "A gentle shampoo for every day.",
        "small_description": ["sulfate free formula", "for dry hair"],
        "pricing": "$10.00 - $20.00",
        "images": ["a.jpg"],
        "category": "beauty",
        "query": "Shampoo ",
        "product_category": "Beauty › Hair Care › Shampoo",
        "customization_options": {
            "Color": [{"value": "Navy/Blue", "image": None}, {"value": "red", "image": None}],
            "size": [{"value": "Small", "image": None}, {"value": "Large", "image": None}],
        },
    },
    {
        "asin": "B0TESTBBB2",
        "name": "Zen Shampoo Refill",
        "full_description": "Refill pouch, paraben free.",
        "small_description": "one bullet",
        "pricing": "$5.50",
        "images": [],
        "category": "beauty",
        "query": "shampoo",
        "product_category": "Beauty › Hair Care › Shampoo",
        "customization_options": None,
    },
    {"asin": "nan", "name": "skipped", "full_description": "", "small_description": "", "category": "x",
     "query": "x", "product_category": "x", "customization_options": None},
    {
        "asin": "B0TESTCCC3",
        "name": "Steel Hammer Tool",
        "full_description": "Drives nails.",
        "small_description": ["forged steel head"],
        "images": [],
        "category": "tools",
        "query": "hammer",
        "product_category": "Tools › Hand Tools › Hammers",
        "customization_options": {},
    },
    {"asin": "B0TESTAAA1", "name": "duplicate is skipped", "full_description": "", "small_description": "",
     "category": "x", "query": "x", "product_category": "x", "customization_options": None},
]

ATTRIBUTES = {
    "B0TESTAAA1": {"attributes": ["sulfate free", "dry hair"], "instruction": "i need a sulfate free shampoo",
                   "instruction_attributes": ["sulfate free"]},
    "B0TESTBBB2": {"attributes": ["paraben free"], "instruction": "i want a shampoo refill",
                   "instruction_attributes": ["paraben free"]},
}

HUMAN = {
    "B0TESTAAA1": [
        {"instruction": "i want a red shampoo for dry hair.", "instruction_attributes": ["dry hair"],
         "instruction_options": ["red"]},
        {"instruction": "no attributes: skipped", "instruction_attributes": [], "instruction_options": []},
    ],
    "B0TESTCCC3": [{"instruction": "a steel hammer", "instruction_attributes": ["forged steel"], "instruction_options": []}],
}


def write_shop(tmp: Path, products=PRODUCTS, attributes=ATTRIBUTES, human=HUMAN) -> dict:
    """Write the files; return make() kwargs that use them (cache under ``tmp``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "items.json").write_text(json.dumps(products, indent=1, ensure_ascii=False), encoding="utf-8")
    (tmp / "ins.json").write_text(json.dumps(attributes), encoding="utf-8")
    (tmp / "human.json").write_text(json.dumps(human), encoding="utf-8")
    return {
        "products_path": str(tmp / "items.json"),
        "attributes_path": str(tmp / "ins.json"),
        "cache_root": str(tmp / "cache"),
    }
