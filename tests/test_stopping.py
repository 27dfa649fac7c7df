from localinfer.engine.stopping import StopMatcher


def feed_all(stops, pieces):
    m = StopMatcher(stops)
    out, hit = [], False
    for p in pieces:
        text, hit = m.feed(p)
        out.append(text)
        if hit:
            break
    if not hit:
        out.append(m.flush())
    return "".join(out), hit


def test_stop_string_split_across_pieces_is_not_printed():
    assert feed_all(["STOP"], ["hello S", "TO", "P world"]) == ("hello ", True)


def test_partial_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    m = StopMatcher(["END"])
    assert m.feed("abc E") == ("abc ", False)  # "E" held back
    assert m.feed("X") == ("EX", False)


def test_no_stops_passes_everything_through():
    assert feed_all([], ["a", "b"]) == ("ab", False)


def test_earliest_stop_wins_and_flush_returns_held_text():
    assert feed_all(["b", "a"], ["xxab"]) == ("xx", True)
    assert feed_all(["abc"], ["zz", "ab"]) == ("zzab", False)


def test_the_matched_stop_string_is_named():
    m = StopMatcher(["END", "\n\n"])
    first, hit = m.feed("one\n")
    assert not hit and m.matched is None
    text, hit = m.feed("\ntwo END")
    assert hit and first + text == "one" and m.matched == "\n\n"  # the earliest match in the text wins
