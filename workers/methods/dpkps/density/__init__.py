"""DP density estimates over the private vocabulary Ṽ (method.md, step 4; Wagner et al. 2023).

One module per estimator; each builds one release per class (classes hold disjoint units:
parallel composition) and scores the phrases of Ṽ from it:

* :mod:`.random_features`: random Fourier features (DP-KDE), a bag per class or an
  ensemble of sequence structures (iterative mode);
* :mod:`.exact`: the exact Gaussian kernel density at every phrase of Ṽ;
* :mod:`.centroid`: the class sums of the document embeddings (a linear kernel), or their
  first two moments (a degree-2 polynomial kernel);
* :mod:`.cells`: a second release of each class's sum split in cells (a mixture);
* :mod:`.label_prior`: the declared label names as a prior (post-processing);
* :mod:`.common`: sensitivities, clipping and the release shared by all of them.

Every ``build_*`` function reads private data (the units' phrases or embeddings) and
returns only noisy releases; every ``*_scores`` function and the label prior read only
releases and public inputs.
"""
