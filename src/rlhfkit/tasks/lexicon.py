"""Word lists and sentence templates for the synthetic movie-review corpus.

All text here is original to rlhfkit. Openers (the words a prompt is cut from) are kept free of
sentiment words so that a policy continuing a prompt decides the sentiment itself.
"""

from __future__ import annotations

GENRES: tuple[str, ...] = (
    "gangster",
    "wartime",
    "pirate",
    "science fiction",
    "period",
    "family",
    "spy",
    "western",
    "musical",
    "courtroom",
    "heist",
    "sports",
    "submarine",
    "mystery",
    "road",
    "coming-of-age",
    "monster",
    "political",
    "animated",
    "space",
)
FILM_NOUNS: tuple[str, ...] = (
    "film",
    "movie",
    "picture",
    "feature",
    "drama",
    "caper",
    "epic",
    "sequel",
    "remake",
    "documentary",
    "story",
    "adaptation",
)
DETERMINERS: tuple[str, ...] = ("the", "this", "that", "the new", "the latest", "this year's")
ASPECTS: tuple[str, ...] = (
    "the acting",
    "the script",
    "the soundtrack",
    "the pacing",
    "the camera work",
    "the ending",
    "the dialogue",
    "the lead performance",
    "the editing",
    "the score",
    "the cast",
    "the plot",
    "the set design",
    "the final act",
    "the opening scene",
    "the costumes",
    "the visual effects",
    "the ensemble",
    "the story",
    "the direction",
)
ROLES: tuple[str, ...] = (
    "lead actor",
    "lead actress",
    "director",
    "producer",
    "young star",
    "composer",
    "narrator",
    "second lead",
    "screenwriter",
    "cinematographer",
)
WHEN: tuple[str, ...] = (
    "last night",
    "on Saturday",
    "yesterday",
    "this weekend",
    "on a cold Sunday",
    "last Friday",
    "at a late show",
    "on a long flight",
    "at the local cinema",
    "on opening night",
    "at home",
    "at the film society",
    "after work",
    "on a Tuesday",
    "over the long weekend",
)
COMPANY: tuple[str, ...] = (
    "my sister",
    "my brother",
    "a colleague",
    "my parents",
    "two coworkers",
    "my roommate",
    "my kids",
    "my partner",
    "a neighbour",
    "my film club",
)
RUNTIMES: tuple[str, ...] = (
    "just under two hours",
    "about ninety minutes",
    "nearly three hours",
    "two hours and change",
    "a little over an hour",
)
AUDIENCES: tuple[str, ...] = (
    "anyone",
    "my classmates",
    "families",
    "fans of the genre",
    "film students",
    "weekend viewers",
    "my coworkers",
    "everyone I know",
)

INTENSIFIERS: tuple[str, ...] = (
    "",
    "",
    "",
    "very",
    "really",
    "quite",
    "extremely",
    "incredibly",
    "remarkably",
    "genuinely",
    "absolutely",
)

ADJECTIVES: dict[str, tuple[str, ...]] = {
    "positive": (
        "wonderful",
        "brilliant",
        "delightful",
        "moving",
        "beautiful",
        "charming",
        "gripping",
        "excellent",
        "hilarious",
        "inspiring",
        "fantastic",
        "superb",
        "touching",
        "clever",
        "enjoyable",
        "stunning",
        "heartwarming",
        "impressive",
        "fun",
        "amazing",
        "great",
        "lovely",
        "thrilling",
        "masterful",
    ),
    "negative": (
        "boring",
        "dull",
        "awful",
        "terrible",
        "tedious",
        "clumsy",
        "lifeless",
        "disappointing",
        "painful",
        "weak",
        "messy",
        "forgettable",
        "pointless",
        "bland",
        "horrible",
        "annoying",
        "stupid",
        "ugly",
        "dreadful",
        "lazy",
        "miserable",
        "sloppy",
        "irritating",
        "bad",
    ),
    "neutral": (
        "long",
        "quiet",
        "slow-burning",
        "familiar",
        "unusual",
        "dark",
        "loud",
        "old-fashioned",
        "sprawling",
        "talky",
        "modest",
        "offbeat",
    ),
}
VERBS: dict[str, tuple[str, ...]] = {
    "positive": (
        "elevates",
        "carries",
        "brightens",
        "enriches",
        "lifts",
        "wins over",
    ),
    "negative": (
        "ruins",
        "wastes",
        "drags down",
        "spoils",
        "weakens",
        "sinks",
    ),
}
RECOMMEND: dict[str, tuple[str, ...]] = {
    "positive": (
        "happily recommend it to",
        "gladly recommend it to",
        "definitely recommend it to",
        "strongly recommend it to",
    ),
    "negative": (
        "not recommend it to",
        "never recommend it to",
        "warn",
        "not suggest it to",
    ),
}
VERDICTS: dict[str, tuple[str, ...]] = {
    "positive": ("a joy to watch", "worth every minute", "a real treat", "a pleasure from start to end"),
    "negative": ("a waste of time", "a chore to sit through", "a real letdown", "a mess from start to end"),
}

# First sentences: they start with a neutral opener (the prompt material) and end with a judgement.
# Slots: {subject} {Subject} {when} {When} {company} {runtime} {adj} (intensified) {verdict}.
OPENING_TEMPLATES: tuple[str, ...] = (
    "I watched {subject} {when} and it was {adj}.",
    "{When} I saw {subject} with {company}, and overall it was {adj}.",
    "{Subject} runs {runtime} and feels {adj} from start to finish.",
    "My cousins and I went to see {subject} {when}; we all found it {adj}.",
    "After hearing about {subject} for months, I can say it is {adj}.",
    "We rented {subject} {when} and it turned out {adj}.",
    "Going into {subject} {when}, I found it {adj}.",
    "Having seen {subject} twice now, I think it is {adj}.",
    "{Subject}, which I caught {when} with {company}, is {adj}.",
    "So {company} took me to {subject} {when}, and it was {verdict}.",
    "Just got back from {subject} with {company} and it was {verdict}.",
    "There is a lot to say about {subject}, but mostly that it is {adj}.",
)
# Follow-up sentences. Slots: {aspect} {Aspect} {aspect2} {role} {verb} {adj} {adj2} {recommend}
# {audience} {noun} {verdict}.
FOLLOW_TEMPLATES: tuple[str, ...] = (
    "{Aspect} is {adj}.",
    "The {role} {verb} every scene.",
    "I would {recommend} {audience}.",
    "{Aspect} felt {adj}, and {aspect2} was {adj2}.",
    "Overall, a {adj} {noun}.",
    "In short, it was {verdict}.",
    "Even {aspect} seemed {adj}.",
)
# A contrasting clause, occasionally appended so that some reviews carry mixed signals.
CONTRAST_TEMPLATE = "Still, {aspect} was {adj}."
