"""``tune`` and ``trial`` on the user's own training command: its rounds (:mod:`.command`), the settings applied
inside it at run time (:mod:`.inject`, :mod:`.inject_loader`), what it built (:mod:`.facts`) and the winner in
the project's own terms (:mod:`.terms`)."""
