"""The embedded default catalogue: a deterministic generator of shop products.

It writes the same two files the real data uses, so every loader and cache path is
exercised by the default too:

* a product list (``items_shuffle``-style JSON array: ``asin``, ``name``,
  ``full_description``, ``small_description``, ``pricing``, ``images``, ``category``,
  ``query``, ``product_category``, ``customization_options``);
* an attribute/instruction map (``items_ins_v2``-style JSON object: asin ->
  ``attributes``, ``instruction``, ``instruction_attributes``).

Randomness comes from :class:`random.Random` (its ``random()``/``randrange`` streams are
stable across Python 3 versions and platforms), so ``generate(n, seed)`` is the same
everywhere. Run ``python -m twice_envs.envs.webshop.catalogue_gen OUT_DIR [N]`` to write
the files. :func:`write` streams: products are made and written one batch at a time (the
JSON array and object are opened, extended and closed incrementally, byte for byte what
``json.dumps`` of the whole lists gives), so a 1.18M-product catalogue (about 1.1 GB) is
written with tens of megabytes of memory.
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

#: Products in the embedded default catalogue.
DEFAULT_PRODUCTS = 500
#: Seed of the embedded default catalogue.
DEFAULT_SEED = 0


@dataclass(frozen=True)
class ProductType:
    """One kind of product the generator makes.

    Attributes:
        query: the search query the product was "scraped" for (lower case).
        noun: the product noun phrase used in titles.
        path: the ``product_category`` breadcrumb (``›``-separated).
        attributes: attribute phrases products of this type may have.
        options: option name -> the values a product may offer.
        price: (low, high) dollars.
        descriptors: title words that vary between products.
    """

    query: str
    noun: str
    path: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]
    descriptors: tuple[str, ...]


_COLORS = ("black", "white", "navy blue", "light grey", "red", "dark green", "beige", "pink", "rose gold", "brown")
_SIZES = ("small", "medium", "large", "x-large", "xx-large")
_SHOE = ("6", "7", "8", "8.5", "9", "10", "11", "12")


def _t(query, noun, path, attributes, options, price, descriptors) -> ProductType:
    return ProductType(
        query,
        noun,
        path,
        tuple(attributes),
        tuple((k, tuple(v)) for k, v in options),
        price,
        tuple(descriptors),
    )


#: category -> product types. Five categories, as in the original shop.
CATEGORIES: dict[str, tuple[ProductType, ...]] = {
    "beauty": (
        _t("shampoo", "Shampoo", "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
           ["sulfate free", "paraben free", "dry hair", "natural ingredients", "tea tree", "argan oil", "color treated"],
           [("scent", ["lavender", "coconut", "tea tree", "unscented", "citrus"]), ("size", ["8 fl oz", "16 fl oz", "32 fl oz"])],
           (6.0, 32.0), ["Moisturizing", "Clarifying", "Volumizing", "Repair", "Daily"]),
        _t("face moisturizer", "Face Moisturizer", "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
           ["fragrance free", "sensitive skin", "hyaluronic acid", "anti aging", "oil free", "vitamin c", "cruelty free"],
           [("size", ["1.7 oz", "2.5 oz", "4 oz"])], (9.0, 60.0), ["Hydrating", "Night", "Day", "Gel", "Cream"]),
        _t("lipstick", "Lipstick", "Beauty & Personal Care › Makeup › Lips › Lipstick",
           ["long lasting", "matte finish", "cruelty free", "highly pigmented", "vitamin e"],
           [("color", ["red", "nude", "pink", "berry", "coral", "plum"])], (5.0, 28.0), ["Velvet", "Satin", "Creamy", "Liquid"]),
        _t("body wash", "Body Wash", "Beauty & Personal Care › Skin Care › Body › Cleansers › Body Washes",
           ["natural ingredients", "sensitive skin", "paraben free", "shea butter", "dry skin"],
           [("scent", ["eucalyptus", "vanilla", "lavender", "unscented"]), ("size", ["12 fl oz", "24 fl oz", "pack of 2"])],
           (5.0, 25.0), ["Foaming", "Gentle", "Refreshing", "Nourishing"]),
        _t("nail polish", "Nail Polish", "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Art & Polish › Nail Polish",
           ["quick dry", "long lasting", "non toxic", "high gloss"],
           [("color", ["red", "black", "coral", "lilac", "mint", "silver glitter"])], (4.0, 18.0), ["Gel", "Glossy", "Classic"]),
        _t("hair dryer", "Hair Dryer", "Beauty & Personal Care › Hair Care › Styling Tools › Hair Dryers",
           ["ionic technology", "lightweight design", "fast drying", "low noise", "cool shot"],
           [("color", ["black", "white", "rose gold", "pink"])], (19.0, 120.0), ["Compact", "Travel", "Salon", "Ionic"]),
    ),
    "electronics": (
        _t("wireless earbuds", "Wireless Earbuds", "Electronics › Headphones, Earbuds & Accessories › Earbuds",
           ["noise cancelling", "bluetooth 5.3", "long battery life", "water resistant", "charging case", "hands free"],
           [("color", ["black", "white", "navy blue", "pink"])], (15.0, 150.0), ["True", "Sport", "Mini", "Pro"]),
        _t("phone case", "Phone Case", "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
           ["shockproof", "slim fit", "wireless charging", "screen protector", "drop protection"],
           [("color", ["black", "clear", "navy blue", "dark green", "pink"]), ("size", ["6.1 inch", "6.7 inch"])],
           (7.0, 30.0), ["Rugged", "Slim", "Clear", "Leather"]),
        _t("usb c cable", "USB C Cable", "Electronics › Computers & Accessories › Cables › USB Cables",
           ["fast charging", "braided nylon", "data transfer", "durable design"],
           [("size", ["3 ft", "6 ft", "10 ft"]), ("color", ["black", "white", "red"])], (5.0, 22.0), ["Braided", "Fast", "Right Angle"]),
        _t("bluetooth speaker", "Bluetooth Speaker", "Electronics › Portable Audio & Video › Portable Speakers & Docks › Portable Bluetooth Speakers",
           ["waterproof", "long battery life", "deep bass", "stereo sound", "hands free"],
           [("color", ["black", "blue", "red", "dark green"])], (19.0, 130.0), ["Portable", "Outdoor", "Mini", "Party"]),
        _t("power bank", "Power Bank", "Cell Phones & Accessories › Chargers & Power Adapters › Portable Power Banks",
           ["fast charging", "high capacity", "led display", "usb c", "compact size"],
           [("size", ["10000mah", "20000mah", "26800mah"])], (15.0, 70.0), ["Slim", "Magnetic", "Portable"]),
        _t("hdmi cable", "HDMI Cable", "Electronics › Television & Video › Accessories › Cables › HDMI Cables",
           ["4k resolution", "high speed", "gold plated", "ethernet support"],
           [("size", ["3 ft", "6 ft", "15 ft"])], (6.0, 25.0), ["High Speed", "Ultra", "Braided"]),
    ),
    "fashion": (
        _t("women's running shoes", "Women's Running Shoes", "Clothing, Shoes & Jewelry › Women › Shoes › Athletic › Running",
           ["rubber sole", "lightweight design", "arch support", "breathable mesh", "non slip"],
           [("color", ["black", "white", "pink", "light grey", "navy blue"]), ("size", list(_SHOE))],
           (25.0, 110.0), ["Cushioned", "Trail", "Road", "Everyday"]),
        _t("men's hoodie", "Men's Hoodie", "Clothing, Shoes & Jewelry › Men › Clothing › Fashion Hoodies & Sweatshirts",
           ["machine wash", "cotton blend", "relaxed fit", "drawstring closure", "fleece lined"],
           [("color", ["black", "navy blue", "light grey", "dark green", "red"]), ("size", list(_SIZES))],
           (18.0, 60.0), ["Pullover", "Zip Up", "Heavyweight", "Classic"]),
        _t("men's t-shirt", "Men's T-Shirt", "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
           ["machine wash", "cotton", "short sleeve", "regular fit", "moisture wicking"],
           [("color", ["black", "white", "navy blue", "red", "light grey"]), ("size", list(_SIZES))],
           (8.0, 30.0), ["Crew Neck", "V Neck", "Performance", "Graphic"]),
        _t("women's jeans", "Women's Jeans", "Clothing, Shoes & Jewelry › Women › Clothing › Jeans",
           ["high waist", "stretch denim", "slim fit", "button closure", "machine wash"],
           [("color", ["dark blue", "light blue", "black"]), ("size", ["26", "28", "30", "32"])],
           (20.0, 70.0), ["Skinny", "Straight", "Bootcut", "Mom"]),
        _t("wool socks", "Wool Socks", "Clothing, Shoes & Jewelry › Men › Clothing › Socks › Casual Socks",
           ["merino wool", "moisture wicking", "cushioned sole", "machine wash"],
           [("size", ["medium", "large", "x-large"]), ("color", ["grey", "black", "brown"])], (9.0, 28.0), ["Hiking", "Crew", "Thermal"]),
        _t("women's sandals", "Women's Sandals", "Clothing, Shoes & Jewelry › Women › Shoes › Sandals",
           ["open toe", "ankle strap", "rubber sole", "arch support", "memory foam"],
           [("color", ["black", "beige", "brown", "white"]), ("size", list(_SHOE[:6]))], (15.0, 60.0), ["Flat", "Wedge", "Slide"]),
    ),
    "grocery": (
        _t("coffee beans", "Coffee Beans", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee › Whole Coffee Beans",
           ["dark roast", "medium roast", "single origin", "fair trade", "usda organic"],
           [("size", ["12 ounce", "2 pound", "5 pound"])], (8.0, 55.0), ["Whole Bean", "Espresso", "Breakfast Blend"]),
        _t("green tea", "Green Tea", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Green",
           ["caffeine free", "usda organic", "non gmo", "individually wrapped", "antioxidant rich"],
           [("flavor", ["jasmine", "mint", "lemon", "matcha"]), ("size", ["20 count", "100 count"])], (4.0, 25.0), ["Loose Leaf", "Tea Bags", "Premium"]),
        _t("protein bar", "Protein Bar", "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars",
           ["gluten free", "high protein", "low sugar", "keto friendly", "plant based"],
           [("flavor", ["chocolate chip", "peanut butter", "cookie dough", "salted caramel"]), ("size", ["pack of 12", "pack of 24"])],
           (12.0, 45.0), ["Crunchy", "Chewy", "Whey", "Vegan"]),
        _t("olive oil", "Olive Oil", "Grocery & Gourmet Food › Pantry Staples › Cooking & Baking › Oils › Olive",
           ["extra virgin", "cold pressed", "non gmo", "glass bottle"],
           [("size", ["16.9 fl oz", "33.8 fl oz", "pack of 2"])], (8.0, 40.0), ["Greek", "Italian", "Spanish"]),
        _t("dark chocolate", "Dark Chocolate", "Grocery & Gourmet Food › Candy & Chocolate › Chocolate Bars",
           ["sugar free", "gluten free", "fair trade", "70% cacao", "individually wrapped"],
           [("flavor", ["sea salt", "almond", "orange", "mint"]), ("size", ["pack of 4", "pack of 12"])], (6.0, 35.0), ["Bittersweet", "Artisan", "Belgian"]),
        _t("snack crackers", "Snack Crackers", "Grocery & Gourmet Food › Snack Foods › Crackers",
           ["whole grain", "gluten free", "low sodium", "non gmo"],
           [("flavor", ["sea salt", "cheddar", "rosemary", "everything"]), ("size", ["pack of 6", "pack of 12"])], (4.0, 30.0), ["Crispy", "Baked", "Thin"]),
    ),
    "furniture": (
        _t("bookshelf", "Bookshelf", "Home & Kitchen › Furniture › Home Office Furniture › Bookcases",
           ["easy assembly", "solid wood", "storage space", "living room", "5 tier"],
           [("color", ["white", "black", "walnut", "oak"])], (40.0, 220.0), ["Industrial", "Ladder", "Corner", "Open"]),
        _t("office chair", "Office Chair", "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs › Desk Chairs",
           ["lumbar support", "adjustable height", "breathable mesh", "easy assembly", "high back"],
           [("color", ["black", "grey", "white", "blue"])], (60.0, 320.0), ["Ergonomic", "Executive", "Task", "Gaming"]),
        _t("coffee table", "Coffee Table", "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables",
           ["living room", "storage space", "solid wood", "easy assembly", "tempered glass"],
           [("color", ["walnut", "black", "white", "natural"])], (50.0, 260.0), ["Lift Top", "Round", "Farmhouse", "Modern"]),
        _t("bed frame", "Bed Frame", "Home & Kitchen › Furniture › Bedroom Furniture › Beds, Frames & Bases › Bed Frames",
           ["metal frame", "storage space", "noise free", "easy assembly", "wood slat support"],
           [("size", ["twin", "full", "queen", "king"]), ("color", ["black", "white", "grey"])], (90.0, 450.0), ["Platform", "Upholstered", "Canopy"]),
        _t("blackout curtains", "Blackout Curtains", "Home & Kitchen › Home Décor › Window Treatments › Curtains & Drapes › Panels",
           ["thermal insulated", "machine wash", "living room", "noise reducing", "grommet top"],
           [("color", ["navy blue", "beige", "dark green", "light grey", "black"]), ("size", ["52w x 63l", "52w x 84l", "52w x 96l"])],
           (15.0, 60.0), ["Room Darkening", "Velvet", "Linen Look"]),
        _t("throw pillow covers", "Throw Pillow Covers", "Home & Kitchen › Bedding › Decorative Pillows, Inserts & Covers › Throw Pillow Covers",
           ["living room", "hidden zipper", "machine wash", "soft velvet", "set of 2"],
           [("color", ["mustard yellow", "navy blue", "blush pink", "cream"]), ("size", ["18 x 18 inch", "20 x 20 inch"])],
           (8.0, 35.0), ["Boho", "Farmhouse", "Velvet", "Striped"]),
    ),
}

_SYLLABLES = ("ka", "lo", "mi", "ra", "ve", "to", "su", "ne", "zi", "pa", "do", "re", "ly", "xo", "fi", "ba", "qu", "mo", "te", "no")
_SUFFIXES = ("", "co", " home", " labs", "ly", "ix", " & co", " goods")

_TEMPLATES = (
    "i need a {a0} {q}",
    "i am looking for a {q} that is {a0}",
    "i want a {a0} {q} with {a1}",
    "i'm looking for {a0} {q} for {a1}",
    "find me a {q} with {a0} and {a1}",
    "i would like a {a0} {q}",
    "i need {q} that has {a0}",
    "looking for a {a0} and {a1} {q}",
)


def _brand(rng: random.Random) -> str:
    word = "".join(_SYLLABLES[rng.randrange(len(_SYLLABLES))] for _ in range(2 + rng.randrange(2)))
    return (word + _SUFFIXES[rng.randrange(len(_SUFFIXES))]).title()


def _sample(rng: random.Random, pool: tuple[str, ...], k: int) -> list[str]:
    """``k`` distinct items of ``pool`` in pool order (deterministic, no set iteration)."""
    idx = list(range(len(pool)))
    picked = []
    for _ in range(min(k, len(pool))):
        picked.append(idx.pop(rng.randrange(len(idx))))
    return [pool[i] for i in sorted(picked)]


def _asins(n: int, seed: int) -> list[str]:
    """``n`` distinct ids of 10 characters like real ASINs: 'B0' + 8 base-36 digits drawn at random
    (from a generator of their own, so the products' other draws do not depend on them). Every
    character varies from product to product, as in real ids: ids that share a long prefix
    ('B00000...') read alike on a results page, which makes a listed id hard to copy."""
    rng = random.Random(f"asins-{seed}")
    digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out = []
    for k in rng.sample(range(36**8), n):
        chars = []
        for _ in range(8):
            k, r = divmod(k, 36)
            chars.append(digits[r])
        out.append("B0" + "".join(reversed(chars)))
    return out


def _money(x: float) -> str:
    return f"${x:.2f}"


def generate(num_products: int = DEFAULT_PRODUCTS, seed: int = DEFAULT_SEED) -> tuple[list[dict], dict]:
    """``(products, attributes)`` in the original file formats (see the module docstring)."""
    products: list[dict] = []
    attrs: dict[str, dict] = {}
    for product, entry in iter_products(num_products, seed):
        products.append(product)
        attrs[product["asin"]] = entry
    return products, attrs


def iter_products(num_products: int = DEFAULT_PRODUCTS, seed: int = DEFAULT_SEED) -> Iterator[tuple[dict, dict]]:
    """``(product, attributes entry)`` one at a time, in catalogue order (what :func:`generate` lists)."""
    if num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")
    if num_products > 10**7:
        raise ValueError(f"num_products is at most {10**7}")
    rng = random.Random(seed)
    asins = _asins(num_products, seed)
    types = [(cat, t) for cat in CATEGORIES for t in CATEGORIES[cat]]
    for i in range(num_products):
        category, pt = types[i % len(types)] if i < len(types) else types[rng.randrange(len(types))]
        asin = asins[i]
        brand = _brand(rng)
        descriptor = pt.descriptors[rng.randrange(len(pt.descriptors))]
        p_attrs = _sample(rng, pt.attributes, 2 + rng.randrange(3))
        title_attr = p_attrs[rng.randrange(len(p_attrs))]
        title = f"{brand} {descriptor} {pt.noun}, {title_attr.title()}"
        if rng.random() < 0.5:
            title += f" - {pt.query.title()} for Everyday Use"
        low, high = pt.price
        p1 = round(low + (high - low) * rng.random(), 2)
        if rng.random() < 0.3:
            p2 = round(p1 * (1.2 + rng.random()), 2)
            pricing = f"{_money(p1)} - {_money(p2)}"
        else:
            pricing = _money(p1)
        options: dict[str, list[dict]] = {}
        u = rng.random()
        n_dims = len(pt.options) if u < 0.75 else (0 if u > 0.92 else rng.randrange(len(pt.options) + 1))
        for name, values in pt.options[: max(n_dims, 0)]:
            chosen = _sample(rng, values, 2 + rng.randrange(max(1, len(values) - 1)))
            options[name] = [{"value": v, "image": None} for v in chosen]
        bullets = [f"{a.capitalize()}: this {pt.noun.lower()} is made with {a} in mind." for a in p_attrs]
        bullets.append(f"Sold by {brand}; ships in recyclable packaging.")
        description = (
            f"The {brand} {descriptor.lower()} {pt.noun.lower()} is a {pt.query} built for daily use. "
            f"It features {', '.join(p_attrs)}."
        )
        product = {
            "asin": asin,
            "name": title,
            "full_description": description,
            "small_description": bullets,
            "pricing": pricing,
            "images": [f"generated://{asin}.jpg"],
            "category": category,
            "query": pt.query,
            "product_category": pt.path,
            "customization_options": options,
        }
        ins_attrs = _sample(rng, tuple(p_attrs), 1 + (len(p_attrs) > 2 and rng.random() < 0.5))
        template = _TEMPLATES[rng.randrange(len(_TEMPLATES))]
        if "{a1}" in template and len(ins_attrs) < 2:
            template = "i need a {a0} {q}"
        instruction = template.format(q=pt.query, a0=ins_attrs[0], a1=ins_attrs[-1])
        yield product, {"attributes": p_attrs, "instruction": instruction, "instruction_attributes": ins_attrs}


#: File names :func:`write` uses.
PRODUCTS_FILE, ATTRIBUTES_FILE = "items_generated.json", "items_ins_generated.json"


def write(
    out_dir: str | Path, num_products: int = DEFAULT_PRODUCTS, seed: int = DEFAULT_SEED, batch: int = 2000
) -> tuple[Path, Path]:
    """Write ``items_generated.json`` (the products, an ``items_shuffle``-style JSON array) and
    ``items_ins_generated.json`` (an ``items_ins_v2``-style object); return their paths.

    Streamed: ``batch`` products at a time are encoded and appended, so memory does not
    grow with ``num_products``. Each file is written under a temporary name and renamed
    when complete. The bytes equal ``json.dumps`` of :func:`generate`'s lists.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p_path, a_path = out / PRODUCTS_FILE, out / ATTRIBUTES_FILE
    p_tmp, a_tmp = out / f".{PRODUCTS_FILE}.{os.getpid()}.tmp", out / f".{ATTRIBUTES_FILE}.{os.getpid()}.tmp"
    dumps = json.dumps
    try:
        with open(p_tmp, "w", encoding="utf-8") as pf, open(a_tmp, "w", encoding="utf-8") as af:
            pf.write("[")
            af.write("{")
            first = True
            p_parts: list[str] = []
            a_parts: list[str] = []

            def flush() -> None:
                nonlocal first
                if p_parts:
                    sep = "" if first else ", "
                    pf.write(sep + ", ".join(p_parts))
                    af.write(sep + ", ".join(a_parts))
                    first = False
                    p_parts.clear()
                    a_parts.clear()

            for product, entry in iter_products(num_products, seed):
                p_parts.append(dumps(product))
                a_parts.append(f"{dumps(product['asin'])}: {dumps(entry)}")
                if len(p_parts) >= batch:
                    flush()
            flush()
            pf.write("]")
            af.write("}")
        os.replace(p_tmp, p_path)
        os.replace(a_tmp, a_path)
    except BaseException:
        p_tmp.unlink(missing_ok=True)
        a_tmp.unlink(missing_ok=True)
        raise
    return p_path, a_path


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m twice_envs.envs.webshop.catalogue_gen OUT_DIR [NUM_PRODUCTS [SEED]]")
        return 2
    n = int(argv[1]) if len(argv) > 1 else DEFAULT_PRODUCTS
    seed = int(argv[2]) if len(argv) > 2 else DEFAULT_SEED
    for p in write(argv[0], n, seed):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
