"""Fill in the middle on the Qwen2.5-Coder pair (CPU default weights): six editor-style requests (the code before
the cursor and after it, the middle to write), each decoded greedy by every drafter in a rotating order in one
process, each drafter forgetting what it saw after every request; tokens/s over all requests, tau, and whether
each middle equals `none`'s (docs/serving.md, "Fill in the middle").

    .venv/bin/python scripts/infill.py [--methods none,draft-model,prompt-lookup,suffix,hybrid] [--rounds 2]
"""
from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict

from specdecode.api import SpecDecoder
from specdecode.bench.methods import forgetting
from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig
from specdecode.drafters import get_spec

VECTOR = '''from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Vector:
    x: float
    y: float
    z: float

    def __add__(self, other: Vector) -> Vector:
        return Vector(self.x + other.x, self.y + other.y, self.z + other.z)

'''
VECTOR_AFTER = '''
    def __mul__(self, factor: float) -> Vector:
        return Vector(self.x * factor, self.y * factor, self.z * factor)

    def dot(self, other: Vector) -> float:
        return self.x * other.x + self.y * other.y + self.z * other.z

    def norm(self) -> float:
        return math.sqrt(self.dot(self))
'''
STATS = '''def mean(values: list[float]) -> float:
    """The arithmetic mean of `values`."""
    return sum(values) / len(values)


def median(values: list[float]) -> float:
    """The middle value of `values` (the mean of the two middle ones for an even count)."""
'''
STATS_AFTER = '''

def test_median():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
'''
CLI = '''import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description="Resize images")
    parser.add_argument("--width", type=int, default=640, help="width in pixels")
'''
CLI_AFTER = '''    args = parser.parse_args()
    resize(args.input, args.output, args.width, args.height, args.quality)


if __name__ == "__main__":
    main()
'''
ROUTES = '''from flask import Flask, jsonify, request

app = Flask(__name__)
USERS: dict[int, dict] = {}


@app.get("/users/<int:user_id>")
def get_user(user_id: int):
    user = USERS.get(user_id)
    if user is None:
        return jsonify({"error": "not found"}), 404
    return jsonify(user)


@app.delete("/users/<int:user_id>")
def delete_user(user_id: int):
'''
ROUTES_AFTER = '''

@app.post("/users")
def create_user():
    user = request.get_json()
    user_id = len(USERS) + 1
    USERS[user_id] = user
    return jsonify({"id": user_id}), 201
'''
TESTS = '''import pytest

from shop.cart import Cart


def test_an_empty_cart_costs_nothing():
    cart = Cart()
    assert cart.total() == 0


def test_a_cart_sums_its_items():
    cart = Cart()
    cart.add("apple", price=0.5, quantity=4)
    cart.add("pear", price=0.75, quantity=2)
    assert cart.total() == 3.5


def test_removing_an_item_lowers_the_total():
'''
TESTS_AFTER = '''

def test_a_negative_quantity_is_an_error():
    cart = Cart()
    with pytest.raises(ValueError):
        cart.add("apple", price=0.5, quantity=-1)
'''
SQL = '''import sqlite3


def create_tables(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
    db.execute("CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL, author_id INTEGER)")


def add_author(db: sqlite3.Connection, name: str) -> int:
    cursor = db.execute("INSERT INTO authors (name) VALUES (?)", (name,))
    return cursor.lastrowid


def add_book(db: sqlite3.Connection, title: str, author_id: int) -> int:
'''
SQL_AFTER = '''

def books_by(db: sqlite3.Connection, author_id: int) -> list[str]:
    rows = db.execute("SELECT title FROM books WHERE author_id = ?", (author_id,))
    return [title for (title,) in rows]
'''
REQUESTS = [(VECTOR, VECTOR_AFTER), (STATS, STATS_AFTER), (CLI, CLI_AFTER), (ROUTES, ROUTES_AFTER),
            (TESTS, TESTS_AFTER), (SQL, SQL_AFTER)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--methods", default="none,draft-model,prompt-lookup,suffix,hybrid")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    names = args.methods.split(",")
    decoders = {name: SpecDecoder.load(args.model, DrafterConfig(
        name, draft_model=args.draft_model if get_spec(name).needs_draft_model else None)) for name in names}
    greedy, generation = SamplingConfig(), GenerationConfig(max_new_tokens=args.max_new_tokens)
    for decoder in decoders.values():  # warm-up, then forget what it left
        decoder.generate(STATS, suffix=STATS_AFTER, max_new_tokens=8)
        forgetting(decoder.engine)()
    sums: dict[str, Counter] = defaultdict(Counter)
    same, done = Counter(), 0
    for _ in range(args.rounds):
        for number, (before, after) in enumerate(REQUESTS):
            outputs = {}
            for name in names[done % len(names):] + names[: done % len(names)]:
                began, seq = time.perf_counter(), None
                for seq, _ in decoders[name].stream(before, sampling=greedy, generation=generation,  # noqa: B007
                                                    suffix=after):
                    pass
                wall = time.perf_counter() - began
                sums[name].update(wall=wall, tokens=seq.metrics.new_tokens, passes=seq.metrics.target_passes)
                outputs[name] = seq.output_ids
                forgetting(decoders[name].engine)()
            same.update(name for name in names if outputs[name] == outputs[names[0]])
            if done < len(REQUESTS):
                text = decoders[names[0]].tokenizer.decode(outputs[names[0]], skip_special_tokens=True)
                print(f"--- request {number + 1}, {len(outputs[names[0]])} tokens:\n{text}")
            done += 1
    base = sums[names[0]]["tokens"] / sums[names[0]]["wall"]
    print(f"\n| method | tokens/s | vs {names[0]} | tau | = {names[0]} |\n|---|---:|---:|---:|---:|")
    for name in names:
        total = sums[name]
        rate = total["tokens"] / total["wall"]
        print(f"| {name} | {rate:.1f} | {rate / base:.2f}x | {total['tokens'] / total['passes']:.2f} | "
              f"{same[name]}/{done} |")


if __name__ == "__main__":
    main()
