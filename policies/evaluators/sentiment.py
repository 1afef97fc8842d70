"""A custom evaluator to upload (`crossaudit evaluator upload policies/evaluators/sentiment.py
--name sentiment --dependency "textblob>=0.18"`): TextBlob polarity as a compliance score.

Next to a policy in ``policies/``, this file also serves any custom evaluator named ``sentiment``
that has no ``code`` of its own (``evaluators/<name>.py``; demo_offline.yaml inlines the same code).
"""

from textblob import TextBlob


def evaluate(prompt, response, context):
    polarity = TextBlob(response).sentiment.polarity
    # map polarity [-1, 1] to a compliance score [0, 1]
    return {"score": (polarity + 1) / 2, "details": {"polarity": polarity}}
