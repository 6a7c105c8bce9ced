"""resumeq's attempts and hooks as RQ jobs: written once each (:mod:`~resumeq.queue.attempt_jobs`),
kept until due (:mod:`~resumeq.queue.due`), looked for and settled through RQ
(:mod:`~resumeq.queue.queueing`), and the outbox that carries out what a commit left to do."""
