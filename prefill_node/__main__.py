from prefill_node.server import main

main()
