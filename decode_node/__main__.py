from decode_node.server import main

main()
