"""A varied, deterministic chat-prompt set for self-distilling an EAGLE-3 head (never benchmark questions).

Templates over MT-Bench-like task kinds (writing, roleplay, reasoning, math, coding, extraction, STEM,
humanities, advice, summarising, rewriting), filled from word lists with a seeded RNG.
"""
from __future__ import annotations

import random

TOPICS = ["renewable energy", "the history of tea", "urban gardening", "deep sea creatures", "the printing press",
          "volcanoes", "remote work", "honey bees", "the Silk Road", "quantum computing", "jazz music",
          "the Roman Empire", "climate change", "sleep", "chess", "coral reefs", "electric cars", "meditation",
          "the human heart", "black holes", "ancient Egypt", "social media", "recycling", "the Moon landing",
          "photosynthesis", "bread baking", "marathon training", "public libraries", "the immune system",
          "machine learning", "coffee", "the French Revolution", "rainforests", "bicycles", "vaccines",
          "earthquakes", "the internet", "dinosaurs", "board games", "minimalism", "the ocean tides",
          "origami", "solar panels", "the Renaissance", "time management", "birds migration", "glaciers",
          "smartphones", "the Olympic Games", "mushrooms", "public speaking", "robotics", "the water cycle"]
PLACES = ["Kyoto", "Lisbon", "Patagonia", "Iceland", "Marrakech", "Vancouver", "the Scottish Highlands",
          "Hanoi", "Cape Town", "Buenos Aires", "Norway's fjords", "Tuscany", "Bali", "Prague", "New Zealand"]
ROLES = ["a pirate captain", "a medieval knight", "a friendly librarian", "a detective", "a space explorer",
         "a chef", "a museum guide", "a wise old wizard", "a sports coach", "a travel agent", "a doctor",
         "a history teacher", "a startup founder", "a park ranger"]
NAMES = ["Alice", "Bob", "Carlos", "Dana", "Elif", "Farah", "George", "Hana", "Ivan", "Jia", "Kofi", "Lena",
         "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq"]
LANGS = ["Python", "JavaScript", "C++", "Java", "Rust", "Go"]
FUNCS = ["reverses a string", "checks whether a number is prime", "computes the factorial of n",
         "finds the largest element in a list", "counts the vowels in a string", "merges two sorted lists",
         "removes duplicates from a list", "computes the n-th Fibonacci number", "checks if a string is a palindrome",
         "sums the digits of an integer", "converts Celsius to Fahrenheit", "finds the GCD of two numbers",
         "flattens a nested list", "counts word frequencies in a text", "performs binary search",
         "sorts a list with bubble sort", "validates an email address", "computes the mean and median"]
AUDIENCES = ["a five-year-old", "a high-school student", "a busy executive", "a beginner", "an expert",
             "a grandparent", "a tourist"]
FORMS = ["a short poem", "a haiku", "a limerick", "a short story", "a persuasive paragraph", "a product description",
         "a formal email", "a diary entry", "a speech opening", "a news headline and lead paragraph"]

TEMPLATES = [
    "Write {form} about {topic}.",
    "Explain {topic} to {audience}.",
    "Give me five interesting facts about {topic}.",
    "What are the pros and cons of {topic}?",
    "Compose an engaging travel blog post about a trip to {place}.",
    "Plan a three-day itinerary for {place}.",
    "Pretend you are {role}. Introduce yourself and describe a typical day.",
    "Act as {role} and give advice to someone who is nervous about {topic}.",
    "Write a dialogue between {name} and {name2} about {topic}.",
    "Write a {lang} function that {func}. Explain how it works.",
    "Write a {lang} function that {func}, with a docstring and an example.",
    "What is the time complexity of a function that {func}? Explain.",
    "Solve: {name} has {a} apples and buys {b} more, then gives away {c}. How many are left? Show your steps.",
    "A train travels {a} km in {b} hours. What is its average speed? Explain.",
    "What is {a} times {b} plus {c}? Show the calculation step by step.",
    "Solve the equation {a}x + {b} = {c}. Explain each step.",
    "If a rectangle is {a} cm long and {b} cm wide, what are its area and perimeter?",
    "Find the sum of the first {a} positive integers and explain the formula.",
    "{name} is taller than {name2}, and {name2} is taller than {name3}. Who is the shortest? Explain your reasoning.",
    "In a race, {name} overtakes the person in second place. What position is {name} in now? Explain.",
    "Summarize the main ideas of {topic} in one paragraph.",
    "Describe the scientific principles behind {topic}.",
    "How did {topic} change society? Discuss.",
    "Compare {topic} and {topic2}. What do they have in common?",
    "Write a short essay on the importance of {topic}.",
    "List the steps to get started with {topic}.",
    "What are common misconceptions about {topic}?",
    "Give me tips for improving at {topic}.",
    "Extract the names and ages from this text and list them: {name} is {a} years old, {name2} is {b}, and {name3} turned {c} last week.",
    "From the sentence '{name} moved to {place} in {year} to study {topic}', extract the person, place, year and subject as JSON.",
    "Rewrite this sentence to be more formal: 'hey, {topic} is kinda cool and everyone should check it out'.",
    "Correct the grammar: '{name} and me goes to the store yesterday for buying some stuff about {topic}.'",
    "Write a product review for a book about {topic}.",
    "Create a short quiz with three questions about {topic}, with answers.",
    "Describe {place} using all five senses.",
    "What would happen if {topic} disappeared tomorrow?",
    "Write a motivational message for {audience} about {topic}.",
    "Explain the difference between weather and climate, using {place} as an example.",
    "Draft an email to {name} inviting them to a workshop on {topic}.",
    "Write the opening paragraph of a mystery novel set in {place}.",
    "Give a balanced argument for and against banning {topic}.",
    "Write a recipe inspired by {place}.",
    "Explain how to {func2} in plain English, then give {lang} code.",
    "What questions should a journalist ask an expert on {topic}?",
    "Describe the life of {role} in the year {year}.",
    "Tell me a joke about {topic}, then explain why it is funny.",
]

TOPICS_V2 = ["artificial intelligence ethics", "the stock market", "nuclear power", "the Great Wall of China",
             "video games", "fast fashion", "space tourism", "antibiotics", "democracy", "the Amazon river",
             "cryptocurrency", "volunteering", "learning a second language", "self-driving cars", "friendship",
             "the Industrial Revolution", "plastic pollution", "yoga", "the Mona Lisa", "inflation",
             "homeschooling", "electric guitars", "wildfires", "the Cold War", "gene editing", "podcasts",
             "tiny houses", "the metric system", "penguins", "superstitions", "street food", "3D printing",
             "the placebo effect", "hiking", "wind turbines", "the periodic table", "online privacy",
             "classical music", "procrastination", "the Titanic", "desert ecosystems", "vertical farming"]
JOBS = ["software engineer", "nurse", "teacher", "farmer", "architect", "data scientist", "barista",
        "pilot", "lawyer", "marketing manager", "electrician", "journalist"]
PRODUCTS = ["a smartwatch", "a reusable water bottle", "a language-learning app", "an electric scooter",
            "a noise-cancelling headphone", "a standing desk", "a board game for families", "a solar charger"]
TEMPLATES_V2 = [
    "I am a {job}. How can I use {topic} in my work?",
    "What skills does a {job} need, and how can someone learn them?",
    "Write a persuasive advertisement for {product}.",
    "Write a customer complaint about {product} and a polite reply from the company.",
    "My friend {name} says {topic} is overrated. How should I respond?",
    "Give {n} reasons why someone might change their mind about {topic}.",
    "Explain the history of {topic} as a timeline with key dates.",
    "Imagine you are a {job} in {place}. Describe a challenging day at work.",
    "Suggest {n} names for a company that sells {product}, and explain each.",
    "What are the ethical questions raised by {topic}?",
    "Write a short speech for a graduation ceremony that mentions {topic}.",
    "How would you teach {topic} to a class of {audience}s in one hour? Give a lesson plan.",
    "Can you help me write a cover letter for a {job} position?",
    "Which is better for a small town, {topic} or {topic2}? Argue both sides and conclude.",
    "Describe a futuristic city in the year {year} shaped by {topic}.",
    "Write a letter from {name} to {name2} apologising for missing their birthday.",
    "Translate the idea of {topic} into a simple analogy a child would understand.",
    "What would a {job} and {role} disagree about when discussing {topic}?",
    "Evaluate this argument: '{topic} is the most important invention of all time.' Identify its weaknesses.",
    "There are {a} students in a class and {b} of them play football. What fraction do not? Explain.",
    "A shop sells {product} for {a} dollars with a {c}% discount. What is the final price? Show your work.",
    "Write a {lang} class that represents {product}, with two useful methods.",
    "What are the main differences between {lang} and {lang2}? When would you choose each?",
    "Write a short scene where {role} meets {role2} in {place}.",
    "Rewrite the following in a cheerful tone: 'The meeting about {topic} has been moved to Monday.'",
    "Summarize the plot of an imaginary movie about {topic} in {n} sentences.",
]
CONSTRAINTS = ["Use bullet points.", "Keep it under {n} words.", "Answer in the voice of {role}.",
               "Include a title.", "End with a question for the reader.", "Use exactly {k} paragraphs.",
               "Make it humorous.", "Write it for {audience}.", "Be concise.", "Use simple language.",
               "Give concrete examples.", "Start your answer with a one-sentence summary."]


def _fill(tpl: str, rng: random.Random) -> str:
    n1, n2, n3 = rng.sample(NAMES, 3)
    t1, t2 = rng.sample(TOPICS, 2)
    return tpl.format(topic=t1, topic2=t2, place=rng.choice(PLACES), role=rng.choice(ROLES), name=n1, name2=n2,
                      name3=n3, lang=rng.choice(LANGS), func=rng.choice(FUNCS),
                      func2=rng.choice(FUNCS).replace("computes", "compute").replace("checks", "check")
                      .replace("finds", "find").replace("counts", "count").replace("merges", "merge")
                      .replace("removes", "remove").replace("reverses", "reverse").replace("sums", "sum")
                      .replace("converts", "convert").replace("flattens", "flatten").replace("performs", "perform")
                      .replace("sorts", "sort").replace("validates", "validate"),
                      audience=rng.choice(AUDIENCES), form=rng.choice(FORMS), a=rng.randint(2, 60),
                      b=rng.randint(2, 40), c=rng.randint(1, 30), year=rng.randint(1500, 2030))


def _fill_v2(rng: random.Random) -> str:
    """Prompt set 2: more topics and task kinds, and MT-Bench-like constraints on form, length and voice."""
    tpl = rng.choice(TEMPLATES + TEMPLATES_V2)
    n1, n2, n3 = rng.sample(NAMES, 3)
    (l1, l2), (r1, r2) = rng.sample(LANGS, 2), rng.sample(ROLES, 2)
    p = tpl.format(topic=rng.choice(TOPICS + TOPICS_V2), topic2=rng.choice(TOPICS + TOPICS_V2),
                   place=rng.choice(PLACES), role=r1, role2=r2, name=n1, name2=n2, name3=n3,
                   lang=l1, lang2=l2, func=rng.choice(FUNCS), func2="reverse a string",
                   audience=rng.choice(AUDIENCES), form=rng.choice(FORMS), a=rng.randint(2, 60),
                   b=rng.randint(2, 40), c=rng.randint(1, 30), year=rng.randint(1500, 2030),
                   job=rng.choice(JOBS), product=rng.choice(PRODUCTS), n=rng.randint(3, 8))
    if rng.random() < 0.45:
        p += " " + rng.choice(CONSTRAINTS).format(n=rng.choice([50, 80, 100, 150]), k=rng.randint(2, 4),
                                                   role=rng.choice(ROLES), audience=rng.choice(AUDIENCES))
    return p


def build_prompts(n: int, seed: int = 0, version: int = 1) -> list[str]:
    """n distinct prompts, deterministic in `seed`; `version` 1 is the set the shipped head was first trained
    on, 2 adds topics, task kinds and constraints."""
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        p = _fill(rng.choice(TEMPLATES), rng) if version == 1 else _fill_v2(rng)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out
