"""DP-KPS: differentially private keyphrase prompt seeding.

The numerical core of keyseed. Pure library code: it imports nothing from the web
service (``app``) or from any database layer, so it can run inside a Celery worker,
from the offline command line, or in a notebook. See ``../shared/design/method.md``
(Nagesh et al., 2024) for the method and its privacy accounting.
"""
