"""Storyworld: seeded children's stories with *planted* corpus statistics (the built-in demo corpus).

:func:`generate_stories` writes simple English stories (capitalised sentences, ". , ! \\"") of 80-250
words from templates. Three kinds of ground truth are planted (:data:`PLANTED`, lower-case word tokens):

* adjective → noun bigrams: each planted adjective (``red``, ``shiny``, ``soft``, ``tiny``) occurs only
  directly before one of its five nouns, so row ``red`` of the bigram mapping B̄ peaks on
  ball, car, dress, balloon, hat;
* interchangeable word classes: subjects (she, he, they and six names) start almost every sentence and
  never end a clause; the past-tense verbs (almost) only follow a subject; emotions only follow
  ``felt``. Members of a class share their left contexts, so they are close in the interchangeability
  mapping B̄ᵀB̄ (happy → sad, excited, scared, proud, angry);
* topic contexts: every story has one of seven topics (fish, flower, birds, cake, snow, train, rain),
  whose words recur
  throughout it, from the first sentence on, so the topic token's row of the context mapping Φ̄ weights
  its topic words (fish → pond, lake, water, boat, sea, catch, ...).

Caveats: the stories are template text (repetitive by design); function words (the, a, ., ,) are
frequent in every row of Φ̄, so plant recovery is a statement about rankings among content words or
about rows compared with other rows. The output depends only on ``(n, seed)`` and
:data:`GENERATOR_VERSION`; changing templates must bump the version.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

GENERATOR_VERSION = "1"

NAMES = MappingProxyType({"lily": "she", "anna": "she", "mia": "she", "tom": "he", "timmy": "he",
                          "ben": "he"})
EMOTIONS = ("happy", "sad", "excited", "scared", "proud", "angry")
VERBS_OBJECT = ("saw", "had", "found", "wanted", "loved", "liked")   # + "a ADJ NOUN"
VERBS_MOTION = ("went", "ran", "walked")                             # + "to the PLACE"
ADJECTIVE_NOUNS = MappingProxyType({
    "red": ("ball", "car", "dress", "balloon", "hat"),
    "shiny": ("coin", "ring", "stone", "crown", "key"),
    "soft": ("pillow", "blanket", "kitten", "teddy", "scarf"),
    "tiny": ("bug", "mouse", "box", "cup", "shell"),
})


@dataclass(frozen=True)
class Topic:
    """A story topic: its token, the places stories happen at, and the sentences that mention it."""

    token: str
    places: tuple[str, ...]
    words: tuple[str, ...]          # planted co-occurring words (all appear in the sentences)
    sentences: tuple[str, ...]      # templates: {S} subject, {P} place


TOPICS: Mapping[str, Topic] = MappingProxyType({t.token: t for t in (
    Topic("fish", ("pond", "lake", "sea"),
          ("pond", "lake", "water", "boat", "sea", "catch", "swim", "net", "waves"),
          ("{S} went to the {P} to catch a fish.",
           "{S} saw a fish swim in the water.",
           "{S} had a net to catch a fish in the lake.",
           "{S} ran to the boat by the sea.",
           "{S} saw that the little fish could swim in the blue water.",
           "The waves of the sea were big, but the fish did not mind.",
           "{S} saw a little fish jump out of the pond!",
           "{S} wanted to catch the big fish, but the fish could swim away.",
           "{S} loved the fish in the lake.",
           "{S} looked at the fish in the water from the boat.",
           "The water in the pond was clear, and many fish lived there.")),
    Topic("flower", ("garden", "meadow"),
          ("garden", "bloom", "yellow", "butterfly", "daisy", "seeds", "grow", "petals", "bee"),
          ("{S} went to the {P} to see the flower.",
           "{S} saw a yellow flower in the garden.",
           "{S} had seeds to grow a new flower.",
           "{S} saw the flower bloom in the sun.",
           "{S} saw a butterfly sit on the yellow petals of the flower.",
           "{S} loved the daisy in the garden.",
           "A bee buzzed around the flower in the garden.",
           "{S} wanted the seeds to grow into a flower with yellow petals.",
           "Every daisy in the garden was in bloom.",
           "{S} looked at the butterfly on the flower in the garden.")),
    Topic("birds", ("park", "forest"),
          ("tree", "nest", "sky", "flew", "park", "wings", "sing", "eggs", "branch"),
          ("{S} went to the {P} to see the birds.",
           "{S} saw birds in a tall tree.",
           "{S} saw that the nest of the birds was on a branch of the tree.",
           "The birds flew high in the sky.",
           "{S} loved to hear the birds sing in the park.",
           "{S} found three eggs in the nest of the birds.",
           "{S} saw the birds spread their wings and fly over the tree.",
           "{S} wanted to fly in the sky like the birds.",
           "{S} looked at the birds in the nest in the park.",
           "A branch of the tree was home to the birds.")),
    Topic("cake", ("kitchen", "bakery"),
          ("kitchen", "bake", "sugar", "oven", "sweet", "flour", "candles", "party", "frosting"),
          ("{S} went to the {P} to bake a cake.",
           "{S} had flour and sugar to bake a cake.",
           "{S} put the cake in the hot oven.",
           "{S} saw the cake come out of the oven.",
           "The cake was sweet, with pink frosting.",
           "{S} loved the smell of the cake in the kitchen.",
           "{S} put candles on the cake for the party.",
           "{S} wanted a big cake for the party.",
           "{S} looked at the cake with the candles in the kitchen.",
           "The sugar made the cake sweet.")),
    Topic("snow", ("hill", "yard"),
          ("cold", "winter", "snowman", "white", "sled", "hill", "mittens", "ice", "coat"),
          ("{S} went to the {P} to play in the snow.",
           "{S} saw white snow on the hill.",
           "{S} had a sled to slide down the hill in the snow.",
           "It was winter, and the snow was cold.",
           "{S} made a snowman out of snow.",
           "{S} loved the snow and the ice in winter.",
           "{S} put on mittens and a warm coat to play in the snow.",
           "{S} wanted to build a big snowman in the snow.",
           "{S} looked at the white snow in the yard.",
           "The snow was cold, and there was ice on the hill.")),
    Topic("train", ("station", "tracks"),
          ("station", "tracks", "ride", "ticket", "whistle", "wheels", "seat", "conductor", "window"),
          ("{S} went to the {P} to see the train.",
           "{S} had a ticket to ride the train.",
           "The train blew its whistle, toot toot!",
           "{S} saw the wheels of the train go round on the tracks.",
           "{S} saw the conductor wave from the train.",
           "{S} loved to ride the train to the city.",
           "{S} looked out of the train from a seat by the window.",
           "{S} wanted to ride the long train over the tracks.",
           "The conductor checked the ticket for the train ride.",
           "{S} heard the loud whistle of the train at the station.")),
    Topic("rain", ("street", "puddle"),
          ("clouds", "umbrella", "puddle", "wet", "boots", "thunder", "drops", "rainbow", "splash"),
          ("{S} went out in the rain with an umbrella.",
           "{S} saw dark clouds, and then the rain came.",
           "{S} had boots to jump in the puddle after the rain.",
           "The rain made a big puddle on the street.",
           "{S} loved to splash in the rain.",
           "{S} saw drops of rain fall from the gray clouds.",
           "{S} saw a rainbow over the street after the rain.",
           "{S} heard thunder, but the rain was fun.",
           "{S} got wet in the rain, even with boots and an umbrella.",
           "{S} wanted to play in the rain all day.")),
)})


@dataclass(frozen=True)
class Planted:
    """Ground truth planted by :func:`generate_stories` (lower-case word tokens)."""

    adjective_nouns: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: ADJECTIVE_NOUNS)
    word_classes: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({
        "subjects": ("she", "he", "they", *NAMES),
        "emotions": EMOTIONS,
        "verbs": (*VERBS_OBJECT, *VERBS_MOTION, "felt", "played", "said", "looked", "made", "put", "heard",
                   "ate", "asked", "helped", "smiled", "told", "gave", "sang", "came", "got", "was"),
    }))
    topics: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({k: t.words for k, t in TOPICS.items()}))


PLANTED = Planted()

_GENERIC = (
    "{S} {VO} a {AN}.",
    "{S} {VO} a {AN} near the {P}.",
    "{S} {VM} to the {P} with a friend.",
    "{S} felt {E}.",
    "{S} felt {E}!",
    "{S} felt {E} and smiled.",
    "{S} played with the {AN}.",
    "{S} said, \"I like the {P}!\"",
    "{S} {VM} home.",
    "{S} ate an apple and a cookie.",
    "{S} asked mom for help.",
    "{S} helped dad in the house.",
    "{S} smiled and laughed.",
    "{S} told grandma about the {P}.",
    "{S} gave a {AN} to mom.",
    "{S} sang a song about the {P}.",
    "It was a nice and sunny day.",
    "{S} ate lunch with mom and dad.",
)
_CLOSINGS = (
    "{S} {VM} home at the end of the day and felt {E}.",
    "{S} loved the {P} from that day on.",
    "{S} felt {E}, and that was the end of the day.",
)


def _cap(s: str) -> str:
    return s[0].upper() + s[1:] if s else s


class _Story:
    """One story's state: main character, friend, topic, place."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        names = list(NAMES)
        self.name = rng.choice(names)
        self.friend = rng.choice([n for n in names if n != self.name])
        self.topic = TOPICS[rng.choice(list(TOPICS))]
        self.place = rng.choice(self.topic.places)
        self.together = False

    def subject(self) -> str:
        r = self.rng.random()
        if self.together and r < 0.3:
            return "they"
        if r < 0.6:
            return NAMES[self.name]
        return self.name

    def fill(self, template: str) -> str:
        rng = self.rng
        adj = rng.choice(list(ADJECTIVE_NOUNS))
        out = template.format(
            S="{S}", P=self.place, F=self.friend, E=rng.choice(EMOTIONS), VO=rng.choice(VERBS_OBJECT),
            VM=rng.choice(VERBS_MOTION), AN=f"{adj} {rng.choice(ADJECTIVE_NOUNS[adj])}")
        while "{S}" in out:
            out = out.replace("{S}", self.subject(), 1)
        out = _cap(out)
        # names are proper nouns
        words = out.split(" ")
        return " ".join(_cap(w) if w.strip(",.!\"") in NAMES else w for w in words)


def _one_story(rng: random.Random) -> str:
    st = _Story(rng)
    kind = "girl" if NAMES[st.name] == "she" else "boy"
    opening = (f"Once upon a time, {_cap(st.name)} was a little {kind} who played near the {st.place} "
               "every day.")
    target = rng.randint(90, 220)
    sentences = [opening]
    topic_pool = list(st.topic.sentences)
    rng.shuffle(topic_pool)
    sentences += [st.fill(s) for s in topic_pool[:2]]
    n_words = sum(len(s.split()) for s in sentences)
    i = 2
    while n_words < target:
        if not st.together and rng.random() < 0.15:
            s = f"{_cap(st.friend)} came to play one day."
            st.together = True
        elif rng.random() < 0.6:
            if i >= len(topic_pool):
                rng.shuffle(topic_pool)
                i = 0
            s = st.fill(topic_pool[i])
            i += 1
        else:
            s = st.fill(rng.choice(_GENERIC))
        sentences.append(s)
        n_words += len(s.split())
    sentences.append(st.fill(rng.choice(_CLOSINGS)))
    text = " ".join(sentences)
    words = text.split()
    if len(words) > 250:  # never happens with the targets above; keep the promise anyway
        text = " ".join(words[:249]) + " The end."
    return text


def generate_stories(n: int, seed: int = 0) -> list[str]:
    """``n`` stories (80-250 words each), deterministic in ``(n, seed)``; story i depends on ``seed`` and
    i only, so ``generate_stories(m, s)`` is a prefix of ``generate_stories(n, s)`` for m ≤ n."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return [_one_story(random.Random(f"storyworld-{GENERATOR_VERSION}-{seed}-{i}")) for i in range(n)]


def storyworld_corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Convenience alias of :func:`generate_stories` with the default corpus size."""
    return generate_stories(n, seed)
