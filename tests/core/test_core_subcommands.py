import argparse

from tradewind.core.subcommands import add_command


def test_an_added_command_takes_the_common_options_and_names_its_handler():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workspace")
    parser = argparse.ArgumentParser(prog="tradewind")
    subcommands = parser.add_subparsers(dest="command", required=True)

    def greet(args: argparse.Namespace) -> int:
        return 7

    greeting = add_command(subcommands, common, "greet", greet, help="say hello")
    greeting.add_argument("name")

    args = parser.parse_args(["greet", "ada", "--workspace", "/tmp/w"])
    assert (args.command, args.name, args.workspace) == ("greet", "ada", "/tmp/w")
    assert args.handler(args) == 7
    assert "say hello" in parser.format_help()
