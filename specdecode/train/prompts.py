"""The training prompt set for self-distillation, generated programmatically from templates and word lists
written for this project (no external data; disjoint from the benchmark set, which is the test set).

It covers the benchmark's kinds of request (questions, writing, translation, summarisation, maths, questions
over given passages, code, follow-up turns). Stage 1 prompts stand alone; stage 2 prompts are built from the
target's own stage-1 answers (follow-up turns, "summarise this", "edit this code"), as in self-distillation.
Users add their own prompts with JSONL ({"turns": [...]}) or text files (one prompt per line).
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

from specdecode.errors import ConfigError

Conversation = list[dict]  # chat messages: {"role": "user"|"assistant", "content": str}

SUBJECTS = (
    "volcanoes", "the human heart", "black holes", "magnets", "the stock market", "compound interest", "glaciers",
    "bees", "the printing press", "solar panels", "wind turbines", "the internet", "earthquakes", "DNA",
    "antibiotics", "the Roman Empire", "the moon landing", "recycling", "coffee", "chocolate", "honey",
    "sleep", "dreams", "memory", "the immune system", "bread baking", "yeast", "electric guitars", "pianos",
    "jazz music", "the Olympic Games", "chess", "origami", "mountains", "deserts", "rainforests", "penguins",
    "octopuses", "whales", "elephants", "owls", "spiders", "ants", "sharks", "dolphins", "volunteering",
    "public libraries", "museums", "trains", "bicycles", "airplanes", "submarines", "rockets", "satellites",
    "GPS", "smartphones", "batteries", "electricity", "light bulbs", "microwaves", "clouds", "hurricanes",
    "snow", "fog", "the ocean", "rivers", "lakes", "soil", "compost", "gardening", "tomatoes", "potatoes",
    "rice", "pasta", "cheese", "vitamins", "exercise", "yoga", "running", "swimming", "friendship", "kindness",
    "teamwork", "leadership", "time management", "budgeting", "saving money", "learning a language",
    "reading books", "writing a diary", "photography", "painting", "pottery", "knitting", "camping", "hiking",
    "maps", "calendars", "clocks", "the alphabet", "numbers", "zero", "prime numbers", "fractions", "geometry",
    "statistics", "probability", "robots", "artificial intelligence", "video games", "cartoons", "theatre",
    "cinema", "newspapers", "radio", "podcasts", "email", "passwords", "computer viruses", "cloud storage",
    "databases", "spreadsheets", "the water cycle", "the carbon cycle", "fossils", "dinosaurs", "the Sun",
    "Mars", "Jupiter", "comets", "eclipses", "gravity", "friction", "sound", "echoes", "rainbows", "mirrors",
    "lenses", "telescopes", "microscopes", "cells", "bacteria", "fungi", "trees", "flowers", "seeds",
    "bridges", "skyscrapers", "tunnels", "roads", "traffic lights", "cities", "villages", "markets", "money",
    "taxes", "insurance", "banks", "credit cards", "online shopping", "climate change", "air pollution",
    "plastic waste", "clean water", "vaccines", "first aid", "hand washing", "stress", "meditation", "music",
)
PAIRS = (
    ("a virus", "a bacterium"), ("weather", "a forecast"), ("a lake", "a river"), ("a city", "a town"),
    ("a laptop", "a tablet"), ("tea", "coffee"), ("running", "walking"), ("a frog", "a toad"),
    ("a star", "a planet"), ("saving", "investing"), ("a debit card", "a credit card"), ("RAM", "a hard disk"),
    ("a poem", "a song"), ("a crocodile", "an alligator"), ("rent", "a mortgage"), ("speed", "velocity"),
    ("an ocean", "a sea"), ("a hurricane", "a tornado"), ("a novel", "a short story"), ("baking", "frying"),
    ("Python", "JavaScript"), ("a list", "a tuple in Python"), ("an atom", "a molecule"), ("mass", "weight"),
)
QA_TEMPLATES = (
    "What is {s}?", "Explain the basics of {s}.", "Give a simple explanation of {s}.",
    "What are three interesting facts about {s}?", "How would you explain {s} to a beginner?",
    "What are the advantages and disadvantages of {s}?", "Describe the history of {s} in a few sentences.",
    "Why does {s} matter?", "What should everyone know about {s}?", "Tell me something surprising about {s}.",
    "Give me five tips related to {s}.", "What questions do people often ask about {s}? Answer two of them.",
)
PAIR_TEMPLATES = ("What is the difference between {a} and {b}?", "Compare {a} and {b} in a short paragraph.",
                  "Is {a} similar to {b}? Explain.")

WRITING_TEMPLATES = (
    "Write a short poem about {s}.", "Write a haiku about {s}.", "Write a limerick about {s}.",
    "Write the opening paragraph of a story about {s}.", "Write a short blog post introduction about {s}.",
    "Write a diary entry about a day spent learning about {s}.", "Write a short speech for students about {s}.",
    "Write a short motivational message that mentions {s}.", "Write a riddle whose answer is {s}.",
    "Write a four-line rhyme for children about {s}.", "Write a short news headline and paragraph about {s}.",
    "Write a two-paragraph essay about {s}.", "Write a short dialogue between two friends talking about {s}.",
)
PRODUCTS = ("a folding umbrella", "noise-cancelling headphones", "a solar-powered lamp", "a bamboo toothbrush",
            "a smart alarm clock", "a wooden chess set", "a travel backpack", "a herbal tea blend",
            "a non-stick frying pan", "running shoes", "a desk plant", "a wireless keyboard", "a picnic blanket",
            "a children's science kit", "an electric kettle", "a handmade candle", "a puzzle book")
PRODUCT_TEMPLATES = ("Write a product description of about {n} words for {p}.", "Write a slogan for {p}.",
                     "Write a short customer review of {p}.", "Write an advertisement for {p} aimed at students.")
RECIPIENTS = ("your landlord", "a colleague", "your teacher", "a customer", "your neighbour", "the city council",
              "a hotel", "your team", "a friend", "your doctor's office", "a bookshop", "the school principal")
MATTERS = ("a broken heating system", "rescheduling a meeting", "a late delivery", "thanking them for their help",
           "asking for a recommendation letter", "a noise complaint", "booking a room for two nights",
           "a change in the project deadline", "an invitation to a birthday dinner", "requesting a refund",
           "asking about opening hours", "joining a volunteer group")

EN_SENTENCES = (
    "The weather was warm and sunny all week.", "My sister works in a hospital in the city centre.",
    "We usually eat dinner at seven o'clock.", "The children are playing football in the park.",
    "I would like a cup of tea with milk, please.", "The bus was late again this morning.",
    "Our teacher gave us a lot of homework today.", "The shop on the corner sells fresh bread.",
    "He reads the newspaper every morning before work.", "They are planning a trip to the mountains.",
    "The library is open until eight in the evening.", "She bought a new bicycle last weekend.",
    "It started to rain just as we left the house.", "The concert was cancelled because of the storm.",
    "My grandfather grows tomatoes in his garden.", "Please close the window when you leave.",
    "The museum has a new exhibition about ancient Egypt.", "We need to buy eggs, milk and flour.",
    "The train arrives at platform four.", "I have lived in this town for ten years.",
    "The restaurant serves delicious fish soup.", "Could you tell me the way to the station?",
    "The river flows through the middle of the city.", "My brother is learning to play the violin.",
    "The meeting will start at half past nine.", "She always drinks coffee without sugar.",
    "The cat is sleeping on the sofa.", "We watched a film about the history of flight.",
    "The hotel room had a view of the sea.", "My phone battery is almost empty.",
    "The farmers sell their vegetables at the market.", "Tomorrow will be cold and windy.",
    "He forgot his umbrella at the office.", "The new bridge will open next spring.",
    "Our neighbours have two dogs and a rabbit.", "The exam was easier than I expected.",
    "I am looking for a book about birds.", "The baker starts work at four in the morning.",
    "Children under twelve travel for free.", "The park is full of flowers in May.",
)
FOREIGN_SENTENCES = {
    "French": (
        "Il fait beau aujourd'hui et nous allons à la plage.", "Ma mère prépare un gâteau pour mon anniversaire.",
        "Le magasin ferme à dix-neuf heures.", "Nous avons visité un vieux château pendant les vacances.",
        "Mon frère joue au tennis le samedi.", "Le train pour Lyon part dans dix minutes.",
        "J'aime lire des romans policiers le soir.", "Les enfants apprennent à nager à la piscine.",
        "Il y a un marché sur la place tous les mercredis.", "Elle travaille dans une banque depuis cinq ans.",
        "Nous avons mangé une soupe de légumes délicieuse.", "Le musée est fermé le mardi.",
        "Mon voisin répare son vélo dans le jardin.", "Il pleut beaucoup en automne dans cette région.",
    ),
    "German": (
        "Heute gehen wir mit den Kindern in den Zoo.", "Mein Vater arbeitet in einer kleinen Bäckerei.",
        "Der Zug nach München hat zwanzig Minuten Verspätung.", "Im Sommer fahren wir oft an den See.",
        "Meine Schwester lernt seit zwei Jahren Spanisch.", "Das Restaurant ist am Montag geschlossen.",
        "Wir brauchen noch Milch, Brot und Käse.", "Am Wochenende spiele ich gern Fußball.",
        "Die Bibliothek hat viele neue Bücher bekommen.", "Es schneit seit heute Morgen.",
        "Unser Haus hat einen großen Garten mit Apfelbäumen.", "Der Film beginnt um acht Uhr abends.",
        "Ich trinke jeden Morgen eine Tasse Kaffee.", "Die Kinder malen Bilder für ihre Großeltern.",
    ),
    "Spanish": (
        "Hoy hace mucho calor en la ciudad.", "Mi hermano trabaja en un hotel cerca del mar.",
        "Los domingos comemos en casa de mis abuelos.", "El autobús sale a las ocho y media.",
        "Me gusta pasear por el parque por la tarde.", "La tienda vende frutas y verduras frescas.",
        "Mañana vamos a visitar el museo de arte.", "Mi perro duerme en el jardín.",
        "Estudiamos inglés tres veces por semana.", "El restaurante tiene una terraza muy bonita.",
        "En invierno llueve mucho en el norte.", "Mis amigos juegan al baloncesto los viernes.",
        "La biblioteca abre a las nueve de la mañana.", "Necesito comprar pan y leche.",
    ),
}

MATH_NAMES = ("Anna", "Ben", "Carlos", "Dina", "Eli", "Fatima", "George", "Hana", "Ivan", "Julia", "Kofi", "Lena")
FOLLOW_UPS = (
    "Now make it shorter.", "Rewrite that for a ten-year-old.", "Summarise your answer in one sentence.",
    "Turn your answer into a short poem.", "Give me three more examples.", "Explain that using an analogy.",
    "Make it more formal.", "Make it more casual and friendly.", "Now put the main points in a bulleted list.",
    "What is the most important point in your answer, and why?", "Translate your answer into French.",
    "Can you add a concrete example?", "Rewrite it as a numbered list of steps.", "Now give it a title.",
)
CODE_TASKS = (
    ("is_palindrome", "s", "returns True if the string s reads the same backwards, ignoring case"),
    ("count_vowels", "text", "returns the number of vowels in the text"),
    ("factorial", "n", "returns n! for a non-negative integer n"),
    ("fibonacci", "n", "returns a list of the first n Fibonacci numbers"),
    ("gcd", "a, b", "returns the greatest common divisor of two positive integers"),
    ("flatten", "nested", "flattens a list of lists into a single list"),
    ("unique", "items", "returns the items without duplicates, keeping their first order"),
    ("celsius_to_fahrenheit", "c", "converts a temperature from Celsius to Fahrenheit"),
    ("max_of_list", "numbers", "returns the largest number in a list without using max()"),
    ("capitalize_words", "sentence", "capitalises the first letter of every word"),
    ("is_leap_year", "year", "returns True if the year is a leap year"),
    ("sum_digits", "n", "returns the sum of the digits of a non-negative integer"),
    ("merge_dicts", "a, b", "merges two dictionaries, values of b winning on equal keys"),
    ("chunk", "items, size", "splits a list into chunks of the given size"),
    ("count_words", "text", "returns the number of words in a string"),
    ("second_largest", "numbers", "returns the second largest distinct number in a list"),
    ("binary_search", "items, target", "returns the index of target in a sorted list, or -1"),
    ("average", "numbers", "returns the mean of a list of numbers, or 0 for an empty list"),
    ("remove_punctuation", "text", "removes all punctuation characters from the text"),
    ("transpose", "matrix", "returns the transpose of a matrix given as a list of rows"),
    ("is_anagram", "a, b", "returns True if the two strings are anagrams of each other"),
    ("running_total", "numbers", "returns the list of cumulative sums"),
    ("char_frequency", "text", "returns a dictionary mapping each character to its count"),
    ("rotate_list", "items, k", "rotates a list to the right by k positions"),
    ("validate_email", "address", "returns True if the string looks like a valid email address"),
    ("median", "numbers", "returns the median of a non-empty list of numbers"),
    ("title_case", "text", "converts the text to title case except for short words like 'and' or 'of'"),
    ("to_binary", "n", "returns the binary representation of a non-negative integer as a string"),
    ("read_lines", "path", "reads a text file and returns its non-empty lines"),
    ("compound", "principal, rate, years", "returns the amount after compound interest each year"),
)
CODE_EXTRA = (
    "Write a Python class `Stack` with push, pop and is_empty methods.",
    "Write a Python class `BankAccount` with deposit, withdraw and balance methods.",
    "Write a SQL query that returns the ten most recent orders from a table called orders.",
    "Write a JavaScript function that returns the sum of an array of numbers.",
    "Write a Python script that prints the numbers from 1 to 20 and says whether each is even or odd.",
    "Write a Python function that reads a CSV file and returns the rows as dictionaries.",
    "Explain the difference between a for loop and a while loop in Python, with an example.",
    "Write a bash command that counts the lines in all .txt files of a folder.",
    "Write a Python list comprehension that squares the even numbers from 1 to 10.",
    "Explain what a Python dictionary is and show how to loop over its keys and values.",
)
CODE_EDITS = (
    "Add type hints to every function parameter and return value in the following Python code, and return the "
    "whole edited code.", "Add a docstring to each function in the following Python code, and return the whole "
    "edited code.", "Explain what the following Python code does, line by line.",
    "Write two unit tests with pytest for the following Python code.",
    "Rename the functions in the following Python code to more descriptive names, and return the whole code.",
)
RAG_KINDS = (
    ("town", ("was founded in {year}", "has a population of about {num} people", "is known for its {thing}",
              "holds a festival every {month}", "lies {num2} kilometres from the coast")),
    ("museum", ("opens at {hour} a.m. and closes at {hour2} p.m.", "charges {price} dollars for adults",
                "holds more than {num} objects", "was opened in {year}", "is closed every {day}")),
    ("company", ("employs {num} people", "was started in {year}", "sells {thing}",
                 "gives every employee {num2} days of holiday", "has its main office in {place}")),
    ("park", ("covers {num2} hectares", "opens at {hour} a.m. every day", "has a lake with {thing}",
              "allows dogs only on a lead", "was donated to the city in {year}")),
    ("festival", ("takes place every {month}", "attracts about {num} visitors", "was first held in {year}",
                  "is famous for its {thing}", "costs {price} dollars for a day ticket")),
)
RAG_NAMES = ("Elmbrook", "Stonevale", "Harwick", "Larkspur", "Mossford", "Quillton", "Redmere", "Tamsworth",
             "Ulverby", "Wrenfield", "Ashcombe", "Brinley", "Corvale", "Dunmore", "Fennick", "Glenhollow")
RAG_THINGS = ("wooden boats", "blue cheese", "glass art", "old bridges", "apple orchards", "brass bands",
              "paper lanterns", "rare orchids", "solar boats", "children's books", "garden tools", "swans")
MONTHS = ("January", "March", "May", "June", "July", "August", "September", "October", "December")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Sunday")


def _user(text: str) -> Conversation:
    return [{"role": "user", "content": text}]


def _qa(rng: random.Random) -> str:
    if rng.random() < 0.2:
        a, b = rng.choice(PAIRS)
        return rng.choice(PAIR_TEMPLATES).format(a=a, b=b)
    return rng.choice(QA_TEMPLATES).format(s=rng.choice(SUBJECTS))


def _writing(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.2:
        return rng.choice(PRODUCT_TEMPLATES).format(n=rng.choice((40, 60, 80)), p=rng.choice(PRODUCTS))
    if roll < 0.4:
        return f"Write a short, polite email to {rng.choice(RECIPIENTS)} about {rng.choice(MATTERS)}."
    return rng.choice(WRITING_TEMPLATES).format(s=rng.choice(SUBJECTS))


def _translation(rng: random.Random) -> str:
    if rng.random() < 0.5:
        language = rng.choice(tuple(FOREIGN_SENTENCES))
        text = " ".join(rng.sample(EN_SENTENCES, rng.randint(1, 4)))
        source, target = "English", language
    else:
        language = rng.choice(tuple(FOREIGN_SENTENCES))
        text = " ".join(rng.sample(FOREIGN_SENTENCES[language], rng.randint(1, 4)))
        source, target = language, "English"
    form = rng.choice((f"Translate the following text from {source} into {target}:\n\n{text}",
                       f"Translate into {target}: {text}", f"How do you say this in {target}? {text}"))
    return form


def _math(rng: random.Random) -> str:
    name, other = rng.sample(MATH_NAMES, 2)
    a, b, c = rng.randint(2, 40), rng.randint(2, 15), rng.randint(3, 90)
    pct = rng.choice((10, 15, 20, 25, 30, 40, 50))
    tail = rng.choice(("Show your steps.", "Explain step by step.", "Show your working.", "Solve step by step.", ""))
    problems = (
        f"{name} buys {a} apples at {b * 5} cents each and pays with a {rng.choice((5, 10, 20))} dollar note. "
        f"How much change does {name} get?",
        f"A pair of shoes costs ${c + 20}. It is on sale with {pct}% off. What is the sale price?",
        f"{name} is {b} years older than {other}. Together they are {2 * a + b} years old. How old is each?",
        f"A car travels at {c + 30} kilometres per hour for {b / 2:g} hours. How far does it go?",
        f"A school has {a * 20} pupils and {pct}% of them play an instrument. How many do not play one?",
        f"Solve for x: {b}x - {a} = {b * c - a}.", f"Solve for x: {a}x + {b} = {a * c + b}.",
        f"A recipe needs {c * 10} grams of sugar for {b} cakes. How much sugar is needed for {b + a} cakes?",
        f"{name} saves ${b} every week. How many weeks until {name} has ${b * c}?",
        f"A rectangle is {a} metres long and {b} metres wide. What are its perimeter and area?",
        f"The price of a ticket rose from ${a * 4} to ${a * 5}. By what percentage did it increase?",
        f"What is the average of {a}, {b}, {c} and {a + b}?", f"What is {pct}% of {c * 4}?",
        f"A film starts at {rng.randint(1, 9)}:{rng.choice(('00', '15', '30', '45'))} p.m. and lasts {c + 60} "
        f"minutes. When does it end?",
        f"Convert {c} kilometres into metres and into miles (1 mile is about 1.6 km).",
        f"{name} has {a + b} marbles and gives {b} to {other}, then buys {c % 10 + 1} more. How many are left?",
        f"What is {a} times {c}? Explain how to do it in your head.", f"Simplify the fraction {a * b}/{b * c}.",
    )
    return f"{rng.choice(problems)} {tail}".strip()


def _rag(rng: random.Random) -> str:
    kinds = rng.sample(RAG_KINDS, rng.randint(2, 3))
    passages, facts = [], []
    for number, (kind, attributes) in enumerate(kinds, start=1):
        name = f"{rng.choice(RAG_NAMES)} {kind.title()}" if kind != "town" else f"the town of {rng.choice(RAG_NAMES)}"
        chosen = rng.sample(attributes, 3)
        values = dict(year=rng.randint(1400, 2015), num=rng.randint(20, 90) * 100, num2=rng.randint(2, 60),
                      thing=rng.choice(RAG_THINGS), month=rng.choice(MONTHS), hour=rng.randint(6, 10),
                      hour2=rng.randint(4, 9), price=rng.randint(3, 30), day=rng.choice(DAYS),
                      place=rng.choice(RAG_NAMES))
        sentences = [f"{name[0].upper() + name[1:]} {a.format(**values)}." for a in chosen]
        passages.append(f"Passage {number}: " + " ".join(sentences))
        facts.append((name, chosen[0].split(" {")[0]))
    name, relation = rng.choice(facts)
    question = rng.choice((f"What do the passages say about {name}?", f"When or how much: {name} {relation} what?",
                           f"Which facts are given about {name}? List them."))
    return ("Answer the question using only the passages below. Cite the passage number(s) you used.\n\n"
            + "\n".join(passages) + f"\n\nQuestion: {question}")


def _code(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return rng.choice(CODE_EXTRA)
    name, args, what = rng.choice(CODE_TASKS)
    extra = rng.choice(("", " Include a short docstring.", " Add a few example calls.", " Keep it short."))
    return f"Write a Python function `{name}({args})` that {what}.{extra}"


def _paragraph_request(rng: random.Random) -> str:
    return f"Write a paragraph of about {rng.choice((80, 100, 120))} words about {rng.choice(SUBJECTS)}."


STAGE1 = {"qa": _qa, "writing": _writing, "translation": _translation, "math": _math, "rag": _rag, "code": _code,
          "paragraph": _paragraph_request}
STAGE1_SHARE = {"qa": 0.22, "writing": 0.18, "translation": 0.12, "math": 0.14, "rag": 0.1, "code": 0.14,
                "paragraph": 0.1}


def stage1_prompts(count: int, seed: int = 0) -> list[Conversation]:
    """`count` distinct single-turn conversations, mixed across kinds by STAGE1_SHARE."""
    rng = random.Random(seed)
    kinds, weights = zip(*STAGE1_SHARE.items())
    seen: set[str] = set()
    out: list[Conversation] = []
    attempts = 0
    while len(out) < count and attempts < 50 * count:
        attempts += 1
        text = STAGE1[rng.choices(kinds, weights)[0]](rng)
        if text not in seen:
            seen.add(text)
            out.append(_user(text))
    return out


_CODE_BLOCK = re.compile(r"```(?:python)?\n(.*?)```", re.S)


def stage2_prompts(answered: list[Conversation], count: int, seed: int = 0) -> list[Conversation]:
    """Prompts built from stage-1 conversations that now end with the target's answer: a follow-up turn, a
    summary of a generated paragraph, or an edit of generated code."""
    rng = random.Random(seed + 1)
    out: list[Conversation] = []
    order = list(range(len(answered)))
    rng.shuffle(order)
    for index in order:
        if len(out) >= count:
            break
        conversation = answered[index]
        question, answer = conversation[0]["content"], conversation[-1]["content"].strip()
        if len(answer) < 40:
            continue
        code = _CODE_BLOCK.search(answer)
        if code and rng.random() < 0.7:
            out.append(_user(f"{rng.choice(CODE_EDITS)}\n\n```python\n{code.group(1).strip()}\n```"))
        elif question.startswith("Write a paragraph") and rng.random() < 0.8:
            n = rng.choice((1, 2, 3))
            form = rng.choice((f"Summarise the following passage in {n} sentence{'s' if n > 1 else ''}:",
                               "Summarise the key points of this text as a bulleted list:",
                               "Give the following text a title and a one-sentence summary:"))
            out.append(_user(f"{form}\n\n{answer}"))
        else:
            out.append(conversation + _user(rng.choice(FOLLOW_UPS)))
    return out


def load_user_prompts(paths: list[str]) -> list[Conversation]:
    """User prompt files. JSONL: one {"turns": [...]} or {"prompt": "..."} per line, each user turn becoming
    one single-turn prompt (the target writes the answers). Any other file: one prompt per non-empty line."""
    prompts: list[Conversation] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"cannot read prompts file {path!r}: {error}") from error
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            if path.endswith(".jsonl"):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ConfigError(f"{path}:{number}: not valid JSON ({error.msg})") from None
                turns = record.get("turns") or ([record["prompt"]] if "prompt" in record else None)
                if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
                    raise ConfigError(f"{path}:{number}: expected \"turns\" (list of strings) or \"prompt\"")
                prompts.extend(_user(t) for t in turns)
            else:
                prompts.append(_user(line.strip()))
    return prompts
