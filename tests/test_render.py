

def test_terminal_width_only_for_a_terminal(monkeypatch):
    import io

    from afddiag.render import terminal_width

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("COLUMNS", "57")
    assert terminal_width(io.StringIO()) is None  # a pipe or file: the full layout
    assert terminal_width(Tty()) == 57
