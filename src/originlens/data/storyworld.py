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

Gold syntax: :func:`generate_annotated_stories` returns the same texts with the gold Penn-Treebank tag and
dependency label (the ClearNLP labels of spaCy's English pipelines: nsubj, ROOT, det, dobj, pobj, advmod,
prep, cc, conj, aux, amod, acomp, ...) of every word and punctuation mark, with character spans, taken
from a hand-written analysis of each template (:data:`_GOLD`); :func:`annotate_story` recovers the same
annotation from a story's text alone by matching its sentences against the templates.  They are the
reference for the TinyStories syntax features (arXiv 2603.14087, § on the TinyStories model; see
:mod:`originlens.tasks.syntax`).  The analyses follow spaCy's conventions where English grammar leaves a
choice; another parser may differ on those constructions (bare infinitives after "saw", "out of", ...).

Caveats: the stories are template text (repetitive by design); function words (the, a, ., ,) are
frequent in every row of Φ̄, so plant recovery is a statement about rankings among content words or
about rows compared with other rows. The output depends only on ``(n, seed)`` and
:data:`GENERATOR_VERSION`; changing templates must bump the version.

Size: most of the file is the generator's vocabulary and templates (data, not logic); they are versioned
together with the sampling code by :data:`GENERATOR_VERSION`, so they stay in one file.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

GENERATOR_VERSION = "1"

NAMES = MappingProxyType({"lily": "she", "anna": "she", "mia": "she", "tom": "he", "timmy": "he", "ben": "he"})
EMOTIONS = ("happy", "sad", "excited", "scared", "proud", "angry")
VERBS_OBJECT = ("saw", "had", "found", "wanted", "loved", "liked")  # + "a ADJ NOUN"
VERBS_MOTION = ("went", "ran", "walked")  # + "to the PLACE"
ADJECTIVE_NOUNS = MappingProxyType(
    {
        "red": ("ball", "car", "dress", "balloon", "hat"),
        "shiny": ("coin", "ring", "stone", "crown", "key"),
        "soft": ("pillow", "blanket", "kitten", "teddy", "scarf"),
        "tiny": ("bug", "mouse", "box", "cup", "shell"),
    }
)


@dataclass(frozen=True)
class Topic:
    """A story topic: its token, the places stories happen at, and the sentences that mention it."""

    token: str
    places: tuple[str, ...]
    words: tuple[str, ...]  # planted co-occurring words (all appear in the sentences)
    sentences: tuple[str, ...]  # templates: {S} subject, {P} place


TOPICS: Mapping[str, Topic] = MappingProxyType(
    {
        t.token: t
        for t in (
            Topic(
                "fish",
                ("pond", "lake", "sea"),
                ("pond", "lake", "water", "boat", "sea", "catch", "swim", "net", "waves"),
                (
                    "{S} went to the {P} to catch a fish.",
                    "{S} saw a fish swim in the water.",
                    "{S} had a net to catch a fish in the lake.",
                    "{S} ran to the boat by the sea.",
                    "{S} saw that the little fish could swim in the blue water.",
                    "The waves of the sea were big, but the fish did not mind.",
                    "{S} saw a little fish jump out of the pond!",
                    "{S} wanted to catch the big fish, but the fish could swim away.",
                    "{S} loved the fish in the lake.",
                    "{S} looked at the fish in the water from the boat.",
                    "The water in the pond was clear, and many fish lived there.",
                ),
            ),
            Topic(
                "flower",
                ("garden", "meadow"),
                ("garden", "bloom", "yellow", "butterfly", "daisy", "seeds", "grow", "petals", "bee"),
                (
                    "{S} went to the {P} to see the flower.",
                    "{S} saw a yellow flower in the garden.",
                    "{S} had seeds to grow a new flower.",
                    "{S} saw the flower bloom in the sun.",
                    "{S} saw a butterfly sit on the yellow petals of the flower.",
                    "{S} loved the daisy in the garden.",
                    "A bee buzzed around the flower in the garden.",
                    "{S} wanted the seeds to grow into a flower with yellow petals.",
                    "Every daisy in the garden was in bloom.",
                    "{S} looked at the butterfly on the flower in the garden.",
                ),
            ),
            Topic(
                "birds",
                ("park", "forest"),
                ("tree", "nest", "sky", "flew", "park", "wings", "sing", "eggs", "branch"),
                (
                    "{S} went to the {P} to see the birds.",
                    "{S} saw birds in a tall tree.",
                    "{S} saw that the nest of the birds was on a branch of the tree.",
                    "The birds flew high in the sky.",
                    "{S} loved to hear the birds sing in the park.",
                    "{S} found three eggs in the nest of the birds.",
                    "{S} saw the birds spread their wings and fly over the tree.",
                    "{S} wanted to fly in the sky like the birds.",
                    "{S} looked at the birds in the nest in the park.",
                    "A branch of the tree was home to the birds.",
                ),
            ),
            Topic(
                "cake",
                ("kitchen", "bakery"),
                ("kitchen", "bake", "sugar", "oven", "sweet", "flour", "candles", "party", "frosting"),
                (
                    "{S} went to the {P} to bake a cake.",
                    "{S} had flour and sugar to bake a cake.",
                    "{S} put the cake in the hot oven.",
                    "{S} saw the cake come out of the oven.",
                    "The cake was sweet, with pink frosting.",
                    "{S} loved the smell of the cake in the kitchen.",
                    "{S} put candles on the cake for the party.",
                    "{S} wanted a big cake for the party.",
                    "{S} looked at the cake with the candles in the kitchen.",
                    "The sugar made the cake sweet.",
                ),
            ),
            Topic(
                "snow",
                ("hill", "yard"),
                ("cold", "winter", "snowman", "white", "sled", "hill", "mittens", "ice", "coat"),
                (
                    "{S} went to the {P} to play in the snow.",
                    "{S} saw white snow on the hill.",
                    "{S} had a sled to slide down the hill in the snow.",
                    "It was winter, and the snow was cold.",
                    "{S} made a snowman out of snow.",
                    "{S} loved the snow and the ice in winter.",
                    "{S} put on mittens and a warm coat to play in the snow.",
                    "{S} wanted to build a big snowman in the snow.",
                    "{S} looked at the white snow in the yard.",
                    "The snow was cold, and there was ice on the hill.",
                ),
            ),
            Topic(
                "train",
                ("station", "tracks"),
                ("station", "tracks", "ride", "ticket", "whistle", "wheels", "seat", "conductor", "window"),
                (
                    "{S} went to the {P} to see the train.",
                    "{S} had a ticket to ride the train.",
                    "The train blew its whistle, toot toot!",
                    "{S} saw the wheels of the train go round on the tracks.",
                    "{S} saw the conductor wave from the train.",
                    "{S} loved to ride the train to the city.",
                    "{S} looked out of the train from a seat by the window.",
                    "{S} wanted to ride the long train over the tracks.",
                    "The conductor checked the ticket for the train ride.",
                    "{S} heard the loud whistle of the train at the station.",
                ),
            ),
            Topic(
                "rain",
                ("street", "puddle"),
                ("clouds", "umbrella", "puddle", "wet", "boots", "thunder", "drops", "rainbow", "splash"),
                (
                    "{S} went out in the rain with an umbrella.",
                    "{S} saw dark clouds, and then the rain came.",
                    "{S} had boots to jump in the puddle after the rain.",
                    "The rain made a big puddle on the street.",
                    "{S} loved to splash in the rain.",
                    "{S} saw drops of rain fall from the gray clouds.",
                    "{S} saw a rainbow over the street after the rain.",
                    "{S} heard thunder, but the rain was fun.",
                    "{S} got wet in the rain, even with boots and an umbrella.",
                    "{S} wanted to play in the rain all day.",
                ),
            ),
        )
    }
)


@dataclass(frozen=True)
class Planted:
    """Ground truth planted by :func:`generate_stories` (lower-case word tokens)."""

    adjective_nouns: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: ADJECTIVE_NOUNS)
    word_classes: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType(
            {
                "subjects": ("she", "he", "they", *NAMES),
                "emotions": EMOTIONS,
                "verbs": (
                    *VERBS_OBJECT,
                    *VERBS_MOTION,
                    "felt",
                    "played",
                    "said",
                    "looked",
                    "made",
                    "put",
                    "heard",
                    "ate",
                    "asked",
                    "helped",
                    "smiled",
                    "told",
                    "gave",
                    "sang",
                    "came",
                    "got",
                    "was",
                ),
            }
        )
    )
    topics: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({k: t.words for k, t in TOPICS.items()})
    )


PLANTED = Planted()

_GENERIC = (
    "{S} {VO} a {AN}.",
    "{S} {VO} a {AN} near the {P}.",
    "{S} {VM} to the {P} with a friend.",
    "{S} felt {E}.",
    "{S} felt {E}!",
    "{S} felt {E} and smiled.",
    "{S} played with the {AN}.",
    '{S} said, "I like the {P}!"',
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


# Templates of the two fixed sentences (their text is written by f-strings in _one_story).
_OPENING = "Once upon a time, {N} was a little {K} who played near the {P} every day."
_FRIEND = "{F} came to play one day."

# ------------------------------------------------------------------------------------------ gold syntax
# Gold Penn-Treebank tag and dependency label (ClearNLP label set, as spaCy's English pipelines use) of
# every token of every template; tokens are ``{SLOT}``, alphabetic runs and single punctuation characters
# (:data:`_TEMPLATE_TOKEN`).  A literal token's entry is ``TAG/label``; a slot's entry is its label (its
# tag comes from the slot: :func:`_slot_words`; ``{AN}`` is two words, JJ/amod + NN/label).  Conventions
# follow spaCy's English models where the analysis is a choice: a bare-infinitive complement of a
# perception verb ("saw a fish swim") is ``ccomp`` with its own ``nsubj``; an infinitive after a noun
# ("a net to catch") is ``acl``, a purpose infinitive after a verb ("went ... to catch") ``advcl``, after
# want/love ``xcomp``; quotes are ````/''`` with label ``punct``.
_GOLD: Mapping[str, str] = MappingProxyType(
    {
        _OPENING: "RB/advmod IN/prep DT/det NN/pobj ,/punct nsubj VBD/ROOT DT/det JJ/amod attr WP/nsubj VBD/relcl "
        "IN/prep DT/det pobj DT/det NN/npadvmod ./punct",
        _FRIEND: "nsubj VBD/ROOT TO/aux VB/advcl CD/nummod NN/npadvmod ./punct",
        # fish
        "{S} went to the {P} to catch a fish.": "nsubj VBD/ROOT IN/prep DT/det pobj TO/aux VB/advcl DT/det NN/dobj ./punct",
        "{S} saw a fish swim in the water.": "nsubj VBD/ROOT DT/det NN/nsubj VB/ccomp IN/prep DT/det NN/pobj ./punct",
        "{S} had a net to catch a fish in the lake.": "nsubj VBD/ROOT DT/det NN/dobj TO/aux VB/acl DT/det NN/dobj IN/prep DT/det NN/pobj ./punct",
        "{S} ran to the boat by the sea.": "nsubj VBD/ROOT IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "{S} saw that the little fish could swim in the blue water.": "nsubj VBD/ROOT IN/mark DT/det JJ/amod NN/nsubj MD/aux VB/ccomp IN/prep DT/det JJ/amod NN/pobj ./punct",
        "The waves of the sea were big, but the fish did not mind.": "DT/det NNS/nsubj IN/prep DT/det NN/pobj VBD/ROOT JJ/acomp ,/punct CC/cc DT/det NN/nsubj VBD/aux RB/neg "
        "VB/conj ./punct",
        "{S} saw a little fish jump out of the pond!": "nsubj VBD/ROOT DT/det JJ/amod NN/nsubj VB/ccomp IN/prep IN/prep DT/det NN/pobj ./punct",
        "{S} wanted to catch the big fish, but the fish could swim away.": "nsubj VBD/ROOT TO/aux VB/xcomp DT/det JJ/amod NN/dobj ,/punct CC/cc DT/det NN/nsubj MD/aux VB/conj "
        "RB/advmod ./punct",
        "{S} loved the fish in the lake.": "nsubj VBD/ROOT DT/det NN/dobj IN/prep DT/det NN/pobj ./punct",
        "{S} looked at the fish in the water from the boat.": "nsubj VBD/ROOT IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "The water in the pond was clear, and many fish lived there.": "DT/det NN/nsubj IN/prep DT/det NN/pobj VBD/ROOT JJ/acomp ,/punct CC/cc JJ/amod NNS/nsubj VBD/conj "
        "RB/advmod ./punct",
        # flower
        "{S} went to the {P} to see the flower.": "nsubj VBD/ROOT IN/prep DT/det pobj TO/aux VB/advcl DT/det NN/dobj ./punct",
        "{S} saw a yellow flower in the garden.": "nsubj VBD/ROOT DT/det JJ/amod NN/dobj IN/prep DT/det NN/pobj ./punct",
        "{S} had seeds to grow a new flower.": "nsubj VBD/ROOT NNS/dobj TO/aux VB/acl DT/det JJ/amod NN/dobj ./punct",
        "{S} saw the flower bloom in the sun.": "nsubj VBD/ROOT DT/det NN/nsubj VB/ccomp IN/prep DT/det NN/pobj ./punct",
        "{S} saw a butterfly sit on the yellow petals of the flower.": "nsubj VBD/ROOT DT/det NN/nsubj VB/ccomp IN/prep DT/det JJ/amod NNS/pobj IN/prep DT/det NN/pobj ./punct",
        "{S} loved the daisy in the garden.": "nsubj VBD/ROOT DT/det NN/dobj IN/prep DT/det NN/pobj ./punct",
        "A bee buzzed around the flower in the garden.": "DT/det NN/nsubj VBD/ROOT IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "{S} wanted the seeds to grow into a flower with yellow petals.": "nsubj VBD/ROOT DT/det NNS/nsubj TO/aux VB/ccomp IN/prep DT/det NN/pobj IN/prep JJ/amod NNS/pobj ./punct",
        "Every daisy in the garden was in bloom.": "DT/det NN/nsubj IN/prep DT/det NN/pobj VBD/ROOT IN/prep NN/pobj ./punct",
        "{S} looked at the butterfly on the flower in the garden.": "nsubj VBD/ROOT IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        # birds
        "{S} went to the {P} to see the birds.": "nsubj VBD/ROOT IN/prep DT/det pobj TO/aux VB/advcl DT/det NNS/dobj ./punct",
        "{S} saw birds in a tall tree.": "nsubj VBD/ROOT NNS/dobj IN/prep DT/det JJ/amod NN/pobj ./punct",
        "{S} saw that the nest of the birds was on a branch of the tree.": "nsubj VBD/ROOT IN/mark DT/det NN/nsubj IN/prep DT/det NNS/pobj VBD/ccomp IN/prep DT/det NN/pobj "
        "IN/prep DT/det NN/pobj ./punct",
        "The birds flew high in the sky.": "DT/det NNS/nsubj VBD/ROOT RB/advmod IN/prep DT/det NN/pobj ./punct",
        "{S} loved to hear the birds sing in the park.": "nsubj VBD/ROOT TO/aux VB/xcomp DT/det NNS/nsubj VB/ccomp IN/prep DT/det NN/pobj ./punct",
        "{S} found three eggs in the nest of the birds.": "nsubj VBD/ROOT CD/nummod NNS/dobj IN/prep DT/det NN/pobj IN/prep DT/det NNS/pobj ./punct",
        "{S} saw the birds spread their wings and fly over the tree.": "nsubj VBD/ROOT DT/det NNS/nsubj VB/ccomp PRP$/poss NNS/dobj CC/cc VB/conj IN/prep DT/det NN/pobj ./punct",
        "{S} wanted to fly in the sky like the birds.": "nsubj VBD/ROOT TO/aux VB/xcomp IN/prep DT/det NN/pobj IN/prep DT/det NNS/pobj ./punct",
        "{S} looked at the birds in the nest in the park.": "nsubj VBD/ROOT IN/prep DT/det NNS/pobj IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "A branch of the tree was home to the birds.": "DT/det NN/nsubj IN/prep DT/det NN/pobj VBD/ROOT NN/attr IN/prep DT/det NNS/pobj ./punct",
        # cake
        "{S} went to the {P} to bake a cake.": "nsubj VBD/ROOT IN/prep DT/det pobj TO/aux VB/advcl DT/det NN/dobj ./punct",
        "{S} had flour and sugar to bake a cake.": "nsubj VBD/ROOT NN/dobj CC/cc NN/conj TO/aux VB/acl DT/det NN/dobj ./punct",
        "{S} put the cake in the hot oven.": "nsubj VBD/ROOT DT/det NN/dobj IN/prep DT/det JJ/amod NN/pobj ./punct",
        "{S} saw the cake come out of the oven.": "nsubj VBD/ROOT DT/det NN/nsubj VB/ccomp IN/prep IN/prep DT/det NN/pobj ./punct",
        "The cake was sweet, with pink frosting.": "DT/det NN/nsubj VBD/ROOT JJ/acomp ,/punct IN/prep JJ/amod NN/pobj ./punct",
        "{S} loved the smell of the cake in the kitchen.": "nsubj VBD/ROOT DT/det NN/dobj IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "{S} put candles on the cake for the party.": "nsubj VBD/ROOT NNS/dobj IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "{S} wanted a big cake for the party.": "nsubj VBD/ROOT DT/det JJ/amod NN/dobj IN/prep DT/det NN/pobj ./punct",
        "{S} looked at the cake with the candles in the kitchen.": "nsubj VBD/ROOT IN/prep DT/det NN/pobj IN/prep DT/det NNS/pobj IN/prep DT/det NN/pobj ./punct",
        "The sugar made the cake sweet.": "DT/det NN/nsubj VBD/ROOT DT/det NN/nsubj JJ/ccomp ./punct",
        # snow
        "{S} went to the {P} to play in the snow.": "nsubj VBD/ROOT IN/prep DT/det pobj TO/aux VB/advcl IN/prep DT/det NN/pobj ./punct",
        "{S} saw white snow on the hill.": "nsubj VBD/ROOT JJ/amod NN/dobj IN/prep DT/det NN/pobj ./punct",
        "{S} had a sled to slide down the hill in the snow.": "nsubj VBD/ROOT DT/det NN/dobj TO/aux VB/acl IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "It was winter, and the snow was cold.": "PRP/nsubj VBD/ROOT NN/attr ,/punct CC/cc DT/det NN/nsubj VBD/conj JJ/acomp ./punct",
        "{S} made a snowman out of snow.": "nsubj VBD/ROOT DT/det NN/dobj IN/prep IN/prep NN/pobj ./punct",
        "{S} loved the snow and the ice in winter.": "nsubj VBD/ROOT DT/det NN/dobj CC/cc DT/det NN/conj IN/prep NN/pobj ./punct",
        "{S} put on mittens and a warm coat to play in the snow.": "nsubj VBD/ROOT RP/prt NNS/dobj CC/cc DT/det JJ/amod NN/conj TO/aux VB/advcl IN/prep DT/det NN/pobj "
        "./punct",
        "{S} wanted to build a big snowman in the snow.": "nsubj VBD/ROOT TO/aux VB/xcomp DT/det JJ/amod NN/dobj IN/prep DT/det NN/pobj ./punct",
        "{S} looked at the white snow in the yard.": "nsubj VBD/ROOT IN/prep DT/det JJ/amod NN/pobj IN/prep DT/det NN/pobj ./punct",
        "The snow was cold, and there was ice on the hill.": "DT/det NN/nsubj VBD/ROOT JJ/acomp ,/punct CC/cc EX/expl VBD/conj NN/attr IN/prep DT/det NN/pobj ./punct",
        # train
        "{S} went to the {P} to see the train.": "nsubj VBD/ROOT IN/prep DT/det pobj TO/aux VB/advcl DT/det NN/dobj ./punct",
        "{S} had a ticket to ride the train.": "nsubj VBD/ROOT DT/det NN/dobj TO/aux VB/acl DT/det NN/dobj ./punct",
        "The train blew its whistle, toot toot!": "DT/det NN/nsubj VBD/ROOT PRP$/poss NN/dobj ,/punct UH/intj UH/intj ./punct",
        "{S} saw the wheels of the train go round on the tracks.": "nsubj VBD/ROOT DT/det NNS/nsubj IN/prep DT/det NN/pobj VB/ccomp RB/advmod IN/prep DT/det NNS/pobj ./punct",
        "{S} saw the conductor wave from the train.": "nsubj VBD/ROOT DT/det NN/nsubj VB/ccomp IN/prep DT/det NN/pobj ./punct",
        "{S} loved to ride the train to the city.": "nsubj VBD/ROOT TO/aux VB/xcomp DT/det NN/dobj IN/prep DT/det NN/pobj ./punct",
        "{S} looked out of the train from a seat by the window.": "nsubj VBD/ROOT IN/prep IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "{S} wanted to ride the long train over the tracks.": "nsubj VBD/ROOT TO/aux VB/xcomp DT/det JJ/amod NN/dobj IN/prep DT/det NNS/pobj ./punct",
        "The conductor checked the ticket for the train ride.": "DT/det NN/nsubj VBD/ROOT DT/det NN/dobj IN/prep DT/det NN/compound NN/pobj ./punct",
        "{S} heard the loud whistle of the train at the station.": "nsubj VBD/ROOT DT/det JJ/amod NN/dobj IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        # rain
        "{S} went out in the rain with an umbrella.": "nsubj VBD/ROOT RP/prt IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "{S} saw dark clouds, and then the rain came.": "nsubj VBD/ROOT JJ/amod NNS/dobj ,/punct CC/cc RB/advmod DT/det NN/nsubj VBD/conj ./punct",
        "{S} had boots to jump in the puddle after the rain.": "nsubj VBD/ROOT NNS/dobj TO/aux VB/acl IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "The rain made a big puddle on the street.": "DT/det NN/nsubj VBD/ROOT DT/det JJ/amod NN/dobj IN/prep DT/det NN/pobj ./punct",
        "{S} loved to splash in the rain.": "nsubj VBD/ROOT TO/aux VB/xcomp IN/prep DT/det NN/pobj ./punct",
        "{S} saw drops of rain fall from the gray clouds.": "nsubj VBD/ROOT NNS/nsubj IN/prep NN/pobj VB/ccomp IN/prep DT/det JJ/amod NNS/pobj ./punct",
        "{S} saw a rainbow over the street after the rain.": "nsubj VBD/ROOT DT/det NN/dobj IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj ./punct",
        "{S} heard thunder, but the rain was fun.": "nsubj VBD/ROOT NN/dobj ,/punct CC/cc DT/det NN/nsubj VBD/conj NN/attr ./punct",
        "{S} got wet in the rain, even with boots and an umbrella.": "nsubj VBD/ROOT JJ/acomp IN/prep DT/det NN/pobj ,/punct RB/advmod IN/prep NNS/pobj CC/cc DT/det NN/conj "
        "./punct",
        "{S} wanted to play in the rain all day.": "nsubj VBD/ROOT TO/aux VB/xcomp IN/prep DT/det NN/pobj DT/det NN/npadvmod ./punct",
        # generic
        "{S} {VO} a {AN}.": "nsubj ROOT DT/det dobj ./punct",
        "{S} {VO} a {AN} near the {P}.": "nsubj ROOT DT/det dobj IN/prep DT/det pobj ./punct",
        "{S} {VM} to the {P} with a friend.": "nsubj ROOT IN/prep DT/det pobj IN/prep DT/det NN/pobj ./punct",
        "{S} felt {E}.": "nsubj VBD/ROOT acomp ./punct",
        "{S} felt {E}!": "nsubj VBD/ROOT acomp ./punct",
        "{S} felt {E} and smiled.": "nsubj VBD/ROOT acomp CC/cc VBD/conj ./punct",
        "{S} played with the {AN}.": "nsubj VBD/ROOT IN/prep DT/det pobj ./punct",
        '{S} said, "I like the {P}!"': "nsubj VBD/ROOT ,/punct ``/punct PRP/nsubj VBP/ccomp DT/det dobj ./punct "
        "''/punct",
        "{S} {VM} home.": "nsubj ROOT RB/advmod ./punct",
        "{S} ate an apple and a cookie.": "nsubj VBD/ROOT DT/det NN/dobj CC/cc DT/det NN/conj ./punct",
        "{S} asked mom for help.": "nsubj VBD/ROOT NN/dobj IN/prep NN/pobj ./punct",
        "{S} helped dad in the house.": "nsubj VBD/ROOT NN/dobj IN/prep DT/det NN/pobj ./punct",
        "{S} smiled and laughed.": "nsubj VBD/ROOT CC/cc VBD/conj ./punct",
        "{S} told grandma about the {P}.": "nsubj VBD/ROOT NN/dobj IN/prep DT/det pobj ./punct",
        "{S} gave a {AN} to mom.": "nsubj VBD/ROOT DT/det dobj IN/dative NN/pobj ./punct",
        "{S} sang a song about the {P}.": "nsubj VBD/ROOT DT/det NN/dobj IN/prep DT/det pobj ./punct",
        "It was a nice and sunny day.": "PRP/nsubj VBD/ROOT DT/det JJ/amod CC/cc JJ/conj NN/attr ./punct",
        "{S} ate lunch with mom and dad.": "nsubj VBD/ROOT NN/dobj IN/prep NN/pobj CC/cc NN/conj ./punct",
        # closings
        "{S} {VM} home at the end of the day and felt {E}.": "nsubj ROOT RB/advmod IN/prep DT/det NN/pobj IN/prep DT/det NN/pobj CC/cc VBD/conj acomp ./punct",
        "{S} loved the {P} from that day on.": "nsubj VBD/ROOT DT/det dobj IN/prep DT/det NN/pobj RP/prt ./punct",
        "{S} felt {E}, and that was the end of the day.": "nsubj VBD/ROOT acomp ,/punct CC/cc DT/nsubj VBD/conj DT/det NN/attr IN/prep DT/det NN/pobj ./punct",
    }
)
_PLACE_TAGS = MappingProxyType({"tracks": "NNS"})  # every other place is a singular noun (NN)
# slot -> the values it takes (the gold annotator's regexes match these, case-insensitively)
_SLOT_VALUES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "S": ("she", "he", "they", *NAMES),
        "N": tuple(NAMES),
        "F": tuple(NAMES),
        "K": ("girl", "boy"),
        "P": tuple(sorted({p for t in TOPICS.values() for p in t.places})),
        "E": EMOTIONS,
        "VO": VERBS_OBJECT,
        "VM": VERBS_MOTION,
        "AN": tuple(f"{a} {n}" for a, ns in ADJECTIVE_NOUNS.items() for n in ns),
    }
)
_TEMPLATE_TOKEN = re.compile(r"\{[A-Z]+\}|[A-Za-z]+|\S")


class GoldWord(NamedTuple):
    """One word of a generated story: characters ``text[start:end]``, Penn tag, dependency label."""

    start: int
    end: int
    tag: str
    dep: str


@dataclass(frozen=True)
class AnnotatedStory:
    """A generated story and the gold tag/label of each of its words (in text order, punctuation included)."""

    text: str
    words: tuple[GoldWord, ...]


def _slot_words(slot: str, value: str, label: str) -> list[tuple[str, str, str]]:
    """(word, tag, label) of a filled slot."""
    if slot == "AN":
        adj, noun = value.split(" ")
        return [(adj, "JJ", "amod"), (noun, "NN", label)]
    if slot == "S":
        tag = "PRP" if value.lower() in ("she", "he", "they") else "NNP"
    elif slot in ("N", "F"):
        tag = "NNP"
    elif slot == "P":
        tag = _PLACE_TAGS.get(value.lower(), "NN")
    elif slot == "E":
        tag = "JJ"
    elif slot in ("VO", "VM"):
        tag = "VBD"
    else:  # K
        tag = "NN"
    return [(value, tag, label)]


class _CompiledTemplate(NamedTuple):
    template: str
    regex: re.Pattern
    tokens: tuple[str, ...]  # template tokens (slots as "{X}")
    entries: tuple[str, ...]  # their gold entries


@functools.cache
def _compiled() -> tuple[_CompiledTemplate, ...]:
    """Every template with its gold entries and a case-insensitive regex whose groups are the slots."""
    out = []
    for template, gold in _GOLD.items():
        tokens = tuple(_TEMPLATE_TOKEN.findall(template))
        entries = tuple(gold.split(" "))
        if len(tokens) != len(entries):
            raise AssertionError(f"storyworld gold for {template!r}: {len(tokens)} tokens, {len(entries)} entries")
        for tok, ent in zip(tokens, entries):
            is_slot = tok.startswith("{") and len(tok) > 1
            if is_slot != ("/" not in ent) or (is_slot and tok[1:-1] not in _SLOT_VALUES):
                raise AssertionError(f"storyworld gold for {template!r}: entry {ent!r} does not fit token {tok!r}")
        pattern, pos = [], 0
        for m in re.finditer(r"\{([A-Z]+)\}", template):
            pattern.append(re.escape(template[pos : m.start()]))
            values = sorted(_SLOT_VALUES[m.group(1)], key=len, reverse=True)
            pattern.append("(" + "|".join(re.escape(v) for v in values) + r")\b")
            pos = m.end()
        pattern.append(re.escape(template[pos:]))
        out.append(_CompiledTemplate(template, re.compile("".join(pattern), re.IGNORECASE), tokens, entries))
    return tuple(out)


def _sentence_words(ct: _CompiledTemplate, sentence: str, offset: int) -> list[GoldWord]:
    """Gold words of ``sentence`` (written from template ``ct``) with spans shifted by ``offset``.

    Raises:
        ValueError: the sentence is not an instance of the template.
    """
    m = ct.regex.fullmatch(sentence)
    if m is None:
        raise ValueError(f"{sentence!r} is not an instance of the template {ct.template!r}")
    values = iter(m.groups())
    words: list[tuple[str, str, str]] = []
    for tok, ent in zip(ct.tokens, ct.entries):
        if "/" in ent:
            tag, label = ent.rsplit("/", 1)
            words.append((tok, tag, label))
        else:
            words += _slot_words(tok[1:-1], next(values), ent)
    out, cur = [], 0
    for word, tag, label in words:
        while sentence[cur].isspace():
            cur += 1
        if sentence[cur : cur + len(word)].lower() != word.lower():  # internal bug: fail loudly
            raise AssertionError(f"storyworld gold: {word!r} not at {cur} of {sentence!r}")
        out.append(GoldWord(offset + cur, offset + cur + len(word), tag, label))
        cur += len(word)
    if sentence[cur:].strip():
        raise AssertionError(f"storyworld gold: {sentence[cur:]!r} left over in {sentence!r}")
    return out


def _truncate_words(text: str, words: list[GoldWord]) -> tuple[str, list[GoldWord]]:
    """The > 250 words rule of :func:`_one_story` applied to text and gold words (never taken in practice)."""
    chunks = text.split()
    if len(chunks) <= 250:
        return text, words
    head = " ".join(chunks[:249])
    kept = [w for w in words if w.end <= len(head)]
    n = len(head)
    return head + " The end.", kept + [
        GoldWord(n + 1, n + 4, "DT", "det"),
        GoldWord(n + 5, n + 8, "NN", "ROOT"),
        GoldWord(n + 8, n + 9, ".", "punct"),
    ]


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
            S="{S}",
            P=self.place,
            F=self.friend,
            E=rng.choice(EMOTIONS),
            VO=rng.choice(VERBS_OBJECT),
            VM=rng.choice(VERBS_MOTION),
            AN=f"{adj} {rng.choice(ADJECTIVE_NOUNS[adj])}",
        )
        while "{S}" in out:
            out = out.replace("{S}", self.subject(), 1)
        out = _cap(out)
        # names are proper nouns
        words = out.split(" ")
        return " ".join(_cap(w) if w.strip(',.!"') in NAMES else w for w in words)


def _one_story(rng: random.Random) -> tuple[str, list[tuple[str, str]]]:
    """(story text, [(template, sentence), ...]): the sentences joined by single spaces are the text
    (before the never-taken truncation below)."""
    st = _Story(rng)
    kind = "girl" if NAMES[st.name] == "she" else "boy"
    opening = f"Once upon a time, {_cap(st.name)} was a little {kind} who played near the {st.place} every day."
    target = rng.randint(90, 220)
    sentences = [opening]
    used = [_OPENING]
    topic_pool = list(st.topic.sentences)
    rng.shuffle(topic_pool)
    for t in topic_pool[:2]:
        sentences.append(st.fill(t))
        used.append(t)
    n_words = sum(len(s.split()) for s in sentences)
    i = 2
    while n_words < target:
        if not st.together and rng.random() < 0.15:
            s = f"{_cap(st.friend)} came to play one day."
            t = _FRIEND
            st.together = True
        elif rng.random() < 0.6:
            if i >= len(topic_pool):
                rng.shuffle(topic_pool)
                i = 0
            t = topic_pool[i]
            s = st.fill(t)
            i += 1
        else:
            t = rng.choice(_GENERIC)
            s = st.fill(t)
        sentences.append(s)
        used.append(t)
        n_words += len(s.split())
    t = rng.choice(_CLOSINGS)
    sentences.append(st.fill(t))
    used.append(t)
    text = " ".join(sentences)
    words = text.split()
    if len(words) > 250:  # never happens with the targets above; keep the promise anyway
        text = " ".join(words[:249]) + " The end."
    return text, list(zip(used, sentences))


def generate_stories(n: int, seed: int = 0) -> list[str]:
    """``n`` stories (80-250 words each), deterministic in ``(n, seed)``; story i depends on ``seed`` and
    i only, so ``generate_stories(m, s)`` is a prefix of ``generate_stories(n, s)`` for m ≤ n."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return [_one_story(_story_rng(seed, i))[0] for i in range(n)]


def _story_rng(seed: int, i: int) -> random.Random:
    return random.Random(f"storyworld-{GENERATOR_VERSION}-{seed}-{i}")


def generate_annotated_stories(n: int, seed: int = 0) -> list[AnnotatedStory]:
    """The stories of :func:`generate_stories` ``(n, seed)`` (same texts) with the gold Penn tag and
    dependency label of every word, from the templates the generator used (see :data:`_GOLD`)."""
    if n < 0:
        raise ValueError("n must be >= 0")
    by_template = {ct.template: ct for ct in _compiled()}
    out = []
    for i in range(n):
        text, used = _one_story(_story_rng(seed, i))
        words: list[GoldWord] = []
        offset = 0
        for template, sentence in used:
            words += _sentence_words(by_template[template], sentence, offset)
            offset += len(sentence) + 1
        text2, words = _truncate_words(" ".join(s for _, s in used), words)
        assert text2 == text
        out.append(AnnotatedStory(text, tuple(words)))
    return out


def annotate_story(text: str) -> tuple[GoldWord, ...]:
    """Gold words of a storyworld story given only its text: each sentence is matched against the
    templates (a sentence ends at a template's end followed by a space or the end of the text).

    Raises:
        ValueError: some sentence is no template's (the text was not written by this generator version).
    """
    words: list[GoldWord] = []
    pos = 0
    n = len(text)
    candidates = _compiled()
    while pos < n:
        found = None
        for ct in candidates:
            m = ct.regex.match(text, pos)
            if m and (m.end() == n or text[m.end()] == " ") and (found is None or m.end() > found[1]):
                found = (ct, m.end())
        if found is None:
            raise ValueError(f"no storyworld template matches the text at character {pos}: {text[pos : pos + 40]!r}")
        ct, end = found
        words += _sentence_words(ct, text[pos:end], pos)
        pos = end + 1
    return tuple(words)


def storyworld_corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Convenience alias of :func:`generate_stories` with the default corpus size."""
    return generate_stories(n, seed)
