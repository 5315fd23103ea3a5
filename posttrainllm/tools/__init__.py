"""The book's tooling, apart from the modules that teach: ``study`` (the study queue and its
cards), ``mastery`` (exercise gates), ``knobs`` (slider figures), ``source`` (package code shown
in a notebook), ``live`` (figures that update while a cell runs), ``lite`` (the browser
editions), ``coverage`` (which notebook section teaches what), ``colab`` (the notebooks' install
cell), ``serve`` (the local book server), ``checkout`` (where a clone's files are) and ``cli``
(the ``posttrainllm`` command)."""
