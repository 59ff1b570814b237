"""Write a broad chat prompt set for head training, in the bench's seven categories (writing, coding,
reasoning, extraction, translation, summarization; multi-turn comes from `--followups`).

    python scripts/make_chat_prompts.py --output data/chat_train_prompts.jsonl
    # after the target answered them (scripts/regenerate_answers.py):
    python scripts/make_chat_prompts.py --followups data/chat_train_answers.jsonl \\
        --output data/chat_followups.jsonl --count 160

Deterministic (fixed seed). Templates are crossed with subject lists; numbers in word problems and the
facts in extraction texts are drawn at random. A prompt sharing any run of 6 words with a prompt of the
bench's chat set (`eagle_trt/data/chat_prompts.jsonl`) is dropped, so the bench stays held out.

`--followups` builds real multi-turn conversations: a user turn, the target's own answer to it, and a
follow-up request, for the target to answer again.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "eagle_trt" / "data" / "chat_prompts.jsonl"
SHINGLE = 6

SUBJECTS = [
    "an old lighthouse", "a city at night", "the first day of school", "a lost umbrella", "autumn leaves",
    "a robot learning to cook", "a quiet library", "a mountain village", "a rainy Monday", "the ocean",
    "a street musician", "a forgotten garden", "a long train journey", "a small bookshop", "winter mornings",
    "a friendly dragon", "a space station", "a busy kitchen", "the last day of summer", "an old photograph",
    "a desert road", "a thunderstorm", "a chess game", "a grandmother's recipe", "a new puppy",
    "a marathon runner", "a broken clock", "a snowy forest", "a school science fair", "a river at dawn",
]
WRITING = [
    "Write a short poem about {s}.", "Write a haiku about {s}.", "Write a limerick about {s}.",
    "Write the opening paragraph of a story about {s}.", "Write a two-paragraph short story about {s}.",
    "Describe {s} in vivid detail.", "Write a diary entry about {s}.", "Write a tweet about {s}.",
]
PRODUCTS = [
    "a solar phone charger", "noise-cancelling headphones", "a standing desk", "a coffee grinder",
    "a hiking backpack", "a smart thermostat", "a yoga mat", "an electric kettle", "a bicycle helmet",
    "a language-learning app", "a mechanical keyboard", "a cast-iron pan", "a travel pillow", "a desk lamp",
]
BUSINESS = [
    "Write a product description for {p}.", "Write a short advertisement for {p}.",
    "Write a customer review of {p}.", "Suggest five names for a company that sells {p}.",
]
EMAILS = [
    "Write a polite email to my manager asking for {x}.", "Write a short message to a colleague about {x}.",
    "Write a formal letter requesting {x}.",
]
EMAIL_TOPICS = [
    "a day off next Friday", "feedback on my presentation", "a meeting to discuss the budget",
    "a refund for a damaged order", "an update on the project timeline", "help with a software problem",
    "a reference letter", "more time to finish the report", "a change to my work schedule",
]
CODE_TASKS = [
    "reverses the words in a sentence", "counts the vowels in a string", "returns the largest element of a list",
    "removes duplicates from a list while keeping order", "merges two sorted lists", "flattens a nested list",
    "finds the second largest number in a list", "checks whether two strings are anagrams",
    "computes the greatest common divisor of two integers", "splits a list into chunks of size k",
    "counts word frequencies in a text", "computes the median of a list of numbers",
    "transposes a matrix given as a list of lists", "implements binary search", "implements insertion sort",
    "checks whether brackets are balanced", "converts a Roman numeral to an integer",
    "finds all pairs in a list that sum to a target", "capitalizes the first letter of every word",
    "returns the Fibonacci numbers below n", "checks whether a number is a power of two",
    "computes the moving average of a list", "groups a list of words by their first letter",
    "finds the longest common prefix of a list of strings", "converts a dictionary to a list of tuples",
    "reads a text file and returns its longest line", "validates a date string in YYYY-MM-DD format",
    "computes the area of a circle from its radius", "returns the indices of all occurrences of a value",
    "counts how many times each character appears in a string", "compresses a string like 'aaabb' to 'a3b2'",
    "checks whether a year is a leap year", "returns the sum of the digits of an integer",
    "finds the mode of a list", "zips two lists into a dictionary", "removes all whitespace from a string",
    "returns the n largest items of a list", "converts seconds to hours, minutes and seconds",
    "checks whether a list is sorted", "interleaves two lists",
]
CODE = [
    "Write a Python function that {t}.", "Implement a Python function which {t}. Include a docstring.",
    "Write a JavaScript function that {t}.", "How would I write a function that {t}? Use Python.",
    "Write a Python function that {t}, and a few unit tests for it.",
]
CODE_QA = [
    "What is the difference between {a} and {b} in Python?", "When should I use {a} instead of {b}?",
]
CODE_PAIRS = [
    ("a list", "a tuple"), ("a set", "a list"), ("== ", "is"), ("a class", "a function"),
    ("append", "extend"), ("a generator", "a list comprehension"), ("a dictionary", "a list of pairs"),
    ("threads", "processes"), ("deepcopy", "copy"), ("an exception", "a return code"),
]
TOPICS = [
    "photosynthesis", "volcanoes", "the stock market", "black holes", "the Renaissance", "vaccines",
    "machine learning", "ocean currents", "the immune system", "earthquakes", "inflation", "solar power",
    "the human brain", "bees", "the Silk Road", "electricity", "the Industrial Revolution", "glaciers",
    "cryptography", "the water cycle", "antibiotics", "the printing press", "rainforests", "jet engines",
    "the Olympic Games", "coral reefs", "democracy", "GPS", "tides", "the blockchain", "wind turbines",
    "sleep", "nutrition", "the moon", "bread making", "recycling", "music theory", "the piano",
]
TOPIC_T = [
    "Explain {t} in simple terms.", "Give me three interesting facts about {t}.",
    "Write a short paragraph about {t} for a ten-year-old.", "What are the main advantages and disadvantages of {t}?",
    "Summarize the history of {t} in a few sentences.", "What are common misconceptions about {t}?",
    "Explain {t} as if I were a high school student.", "List five questions a student might ask about {t}.",
]
NAMES = ["Anna", "Ben", "Chloe", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Keiko", "Liam",
         "Mona", "Nikhil", "Olga", "Pedro", "Rosa", "Sami", "Tara", "Victor"]
ITEMS = ["apples", "pencils", "books", "tickets", "cupcakes", "stickers", "marbles", "oranges", "cards", "stamps"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Seoul", "Toronto", "Krakow", "Dublin", "Osaka", "Quito"]
ROLES = ["the designer", "our accountant", "the new intern", "the head chef", "the team lead", "a nurse",
         "the librarian", "the pilot", "a data analyst", "the landlord"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
ASPECTS = [("the food", "delicious", "cold"), ("the staff", "friendly", "rude"), ("the room", "spotless", "noisy"),
           ("the delivery", "fast", "late"), ("the battery", "long-lasting", "weak"),
           ("the screen", "bright", "dim"), ("the price", "fair", "too high"), ("the app", "intuitive", "buggy")]
SENTENCES = [
    "Where is the nearest train station?", "I would like a cup of coffee, please.", "The meeting starts at nine.",
    "Could you help me carry this box?", "We are going to the beach tomorrow.", "My brother is a doctor.",
    "How much does this jacket cost?", "The library closes early on Sundays.", "I have lost my keys again.",
    "It is going to rain this afternoon.", "Thank you very much for your help.", "Please close the window.",
    "The children are playing in the garden.", "I am learning to play the violin.", "Dinner is ready.",
    "This book is more interesting than the film.", "Can I pay by card?", "The museum is free on Mondays.",
    "She runs five kilometres every morning.", "We need to buy bread and milk.",
]
LANGS = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]
TRANSLATE = ["Translate into {l}: {s}", "How do you say \"{s}\" in {l}?", "Translate this sentence to {l} and "
             "explain any tricky words: {s}"]
PROCESSES = ["baking bread", "changing a flat tyre", "planting a tree", "writing a cover letter", "making pancakes",
             "setting up a home aquarium", "preparing for an exam", "painting a room", "brewing coffee with a "
             "French press", "backing up a computer"]
BOOKS = ["Hamlet", "Pride and Prejudice", "The Odyssey", "Frankenstein", "Moby-Dick", "The Little Prince",
         "Don Quixote", "Jane Eyre", "The Great Gatsby", "A Christmas Carol"]


def _reasoning(rng: random.Random) -> str:
    a, b = rng.randint(3, 60), rng.randint(2, 12)
    n1, n2, item, city = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS), rng.choice(CITIES)
    forms = [
        f"{n1} has {a + b} {item} and gives {b} to {n2}. How many {item} does {n1} have left? Explain.",
        f"A shop sells {item} for {b} dollars each. How much do {a} {item} cost? Show your reasoning.",
        f"A train travels at {a + 40} km/h for {b} hours. How far does it go?",
        f"What is {rng.choice([5, 10, 15, 20, 25, 40])}% of {a * 10}? Show the steps.",
        f"Is {rng.randint(20, 200)} a prime number? Explain why or why not.",
        f"{n1} reads {b} pages a day. How many days will a {a * 10}-page book take?",
        f"If a recipe for {b} people needs {a} grams of flour, how much is needed for {b * 3} people?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
        f"{n1} is {b} years older than {n2}. In {a} years their ages will add up to {2 * a + 2 * b + 30}. "
        f"How old is {n2} now?",
        f"Sort these numbers from smallest to largest: {', '.join(str(rng.randint(1, 500)) for _ in range(7))}.",
        f"How many minutes are there in {b} days? Show your work.",
        f"A car uses {b} litres of fuel per 100 km. How much fuel does it need for {a * 10} km?",
    ]
    return rng.choice(forms)


def _extraction(rng: random.Random) -> str:
    n1, n2, n3 = rng.sample(NAMES, 3)
    r1, r2 = rng.sample(ROLES, 2)
    c1, c2 = rng.sample(CITIES, 2)
    d1 = f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {rng.randint(2015, 2026)}"
    d2 = f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {rng.randint(2015, 2026)}"
    q, price, item = rng.randint(2, 9), f"{rng.randint(1, 90)}.{rng.randint(0, 99):02d}", rng.choice(PRODUCTS)
    text = rng.choice([
        f"{n1}, {r1}, flew from {c1} to {c2} on {d1} to meet {n2}, {r2}, and came back on {d2}.",
        f"On {d1} {n1} ordered {q} units of {item} at {price} euros each; {n2} approved the order on {d2}.",
        f"{n1} and {n2} opened a cafe in {c1} on {d1}. {n3} joined them as {r1} a year later.",
    ])
    good, bad = rng.sample(ASPECTS, 2)
    review = f"{good[0].capitalize()} was {good[1]}, but {bad[0]} was {bad[2]}."
    return rng.choice([
        f"Extract all the names and roles from this text: {text}", f"List every date mentioned here: {text}",
        f"Return the people, places and dates in this text as JSON: {text}",
        f"Which cities are mentioned in this text, and in what order? {text}",
        f"What is the main complaint in this review? {review}", f"Classify the sentiment of this review: {review}",
        f"Extract the product, quantity and price from this sentence as JSON: I bought {q} x {item} for {price} "
        "dollars each.",
    ])


def _doc_paragraphs() -> list[str]:
    """Prose paragraphs of standard-library module docstrings: real text to summarize."""
    import ast
    import sysconfig

    out = []
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if {"test", "tests", "site-packages"} & set(path.relative_to(root).parts):
            continue
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for block in (doc or "").split("\n\n"):
            para = " ".join(block.split())
            if 200 <= len(para) <= 700 and para[-1] == "." and not re.search(r"[>{}]{2}|\$|::|  |\(\)", block):
                out.append(para)
    return out


def _shingles(text: str) -> set[tuple[str, ...]]:
    w = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(w[i:i + SHINGLE]) for i in range(len(w) - SHINGLE + 1)}


def _bench_shingles() -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for line in BENCH.read_text(encoding="utf-8").splitlines():
        if line.strip():
            for m in json.loads(line).get("messages", []):
                out |= _shingles(m["content"])
    return out


def prompts(seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = [("writing", t.format(s=s)) for s in SUBJECTS for t in rng.sample(WRITING, 3)]
    out += [("writing", t.format(p=p)) for p in PRODUCTS for t in rng.sample(BUSINESS, 2)]
    out += [("writing", t.format(x=x)) for x in EMAIL_TOPICS for t in EMAILS]
    out += [("coding", t.format(t=task)) for task in CODE_TASKS for t in rng.sample(CODE, 2)]
    out += [("coding", t.format(a=a, b=b)) for a, b in CODE_PAIRS for t in CODE_QA]
    out += [("explain", t.format(t=topic)) for topic in TOPICS for t in rng.sample(TOPIC_T, 4)]
    out += [("reasoning", _reasoning(rng)) for _ in range(120)]
    out += [("extraction", _extraction(rng)) for _ in range(100)]
    out += [("translation", rng.choice(TRANSLATE).format(l=lang, s=s)) for s in SENTENCES for lang in rng.sample(LANGS, 4)]
    paras = _doc_paragraphs()
    out += [("summarization", rng.choice(["Summarize in one sentence: {p}", "Summarize the main idea: {p}",
                                          "Explain this in plain words: {p}"]).format(p=p)) for p in paras[:60]]
    out += [("summarization", f"Summarize the key steps of {p}.") for p in PROCESSES]
    out += [("summarization", f"Give a short summary of the plot of {b}.") for b in BOOKS]
    bench = _bench_shingles()
    kept = [(c, p) for c, p in dict.fromkeys(out) if not (_shingles(p) & bench)]
    rng.shuffle(kept)
    return kept


FOLLOWUPS = [
    "Can you make that shorter?", "Give me a concrete example.", "Explain that to a ten-year-old.",
    "Now turn it into a bullet list.", "What are the downsides?", "Can you say that more formally?",
    "Translate your answer into Spanish.", "Add one more point.", "Why is that?", "Rewrite it as a short poem.",
    "Can you add comments to explain each step?", "Summarize your answer in one sentence.",
]


def followups(answers_path: Path, count: int, seed: int) -> list[dict]:
    """Conversations: a user turn, the target's own (complete) answer, and a follow-up request."""
    rng = random.Random(seed)
    rows = [json.loads(x) for x in answers_path.read_text(encoding="utf-8").splitlines() if x.strip()]
    rows = [r for r in rows if r.get("eos") and "prompt" in r and r.get("chat", True) and len(r["response"]) < 900]
    rng.shuffle(rows)
    return [{"category": "multi-turn",
             "messages": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["response"]},
                          {"role": "user", "content": rng.choice(FOLLOWUPS)}]} for r in rows[:count]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--followups", type=Path, help="answers file: write multi-turn follow-ups instead")
    ap.add_argument("--count", type=int, default=160, help="with --followups: how many conversations")
    args = ap.parse_args()
    if args.followups:
        rows = followups(args.followups, args.count, args.seed)
    else:
        rows = [{"category": c, "prompt": p} for c, p in prompts(args.seed)]
    with open(args.output, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(rows)} rows -> {args.output}")


if __name__ == "__main__":
    main()
