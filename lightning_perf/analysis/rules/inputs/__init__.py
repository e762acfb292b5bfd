"""The input pipeline's rules: waiting for data (:mod:`.waiting`), why a batch is late (:mod:`.loading`), what a
worker's hand-off costs (:mod:`.worker_model`) and per-sample work no worker count removes (:mod:`.pipeline`)."""
