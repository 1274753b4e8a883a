"""The draft head's data, training and gate calibration: self-distilled continuations of the
target (:mod:`.selfdistill`), their corpus and splits (:mod:`.corpus`, :mod:`.dataset`,
:mod:`.instructions`), the head's training loop (:mod:`.trainer`) and the warm-up records a
gate is calibrated from (:mod:`.calibration`)."""
