"""Write the prompt set the demo head is trained on (self-distillation: the target answers them).

    python scripts/make_train_prompts.py --output data/train_prompts.jsonl

Deterministic: templates crossed with topics, shuffled with a fixed seed. It deliberately overlaps
nothing with the held-out evaluation sets (the bench's chat prompts, HumanEval's last prompts).
"""

from __future__ import annotations

import argparse
import json
import random

CODE_TASKS = [
    "reverses a string", "checks whether a string is a palindrome", "counts the vowels in a string",
    "returns the largest element of a list", "removes duplicates from a list while keeping order",
    "merges two sorted lists", "computes the factorial of n", "flattens a nested list",
    "finds the second largest number in a list", "checks whether two strings are anagrams",
    "converts Celsius to Fahrenheit", "computes the greatest common divisor of two integers",
    "returns the n-th prime number", "splits a list into chunks of size k", "counts word frequencies in a text",
    "validates an email address with a regular expression", "computes the median of a list of numbers",
    "rotates a list by k positions", "transposes a matrix given as a list of lists", "parses a CSV line",
    "implements binary search", "implements bubble sort", "checks whether brackets are balanced",
    "returns the running sum of a list", "converts a Roman numeral to an integer",
    "converts an integer to binary without using bin()", "finds all pairs in a list that sum to a target",
    "capitalizes the first letter of every word", "computes the dot product of two vectors",
    "reads a JSON file and returns the value of a key",
]
CODE_TEMPLATES = [
    "Write a Python function that {t}.", "Implement a function in Python which {t}. Add a docstring.",
    "Show me Python code that {t}, with a short explanation.",
]
TOPICS = [
    "photosynthesis", "the water cycle", "how vaccines work", "black holes", "the French Revolution",
    "compound interest", "machine learning", "climate change", "the immune system", "plate tectonics",
    "supply and demand", "the internet", "electric cars", "the Roman Empire", "sleep", "recycling",
    "the moon landing", "volcanoes", "inflation", "renewable energy", "the human heart", "DNA",
    "gravity", "the printing press", "bees", "rainbows", "earthquakes", "democracy", "coffee", "music theory",
]
TOPIC_TEMPLATES = [
    "Explain {t} in simple terms.", "Give me three interesting facts about {t}.",
    "Write a short paragraph about {t} for a ten-year-old.", "What are the main causes and effects of {t}?",
    "Summarize the history of {t} in a few sentences.", "Write a haiku about {t}.",
]
GENERAL = [
    "How can I improve my time management?", "Give me a recipe for a simple vegetarian dinner.",
    "What should I pack for a weekend hiking trip?", "Write a polite email asking for a deadline extension.",
    "How do I start learning to play the guitar?", "Suggest five names for a bakery.",
    "What is the difference between a list and a tuple in Python?", "Explain what a REST API is.",
    "How does a hash table work?", "What is recursion? Give an example.", "Explain big-O notation.",
    "Write a short story about a robot who learns to paint.", "Give me tips for a job interview.",
    "Translate 'Good morning, how are you?' into French and Spanish.", "What is the Pythagorean theorem?",
    "How many minutes are there in a week? Show your reasoning.", "Write a limerick about a cat.",
    "What are the benefits of regular exercise?", "Explain the difference between weather and climate.",
    "Write a product description for a reusable water bottle.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    prompts = [tpl.format(t=t) for t in CODE_TASKS for tpl in CODE_TEMPLATES]
    prompts += [tpl.format(t=t) for t in TOPICS for tpl in TOPIC_TEMPLATES]
    prompts += GENERAL
    random.Random(args.seed).shuffle(prompts)
    with open(args.output, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    print(f"{len(prompts)} prompts -> {args.output}")


if __name__ == "__main__":
    main()
