"""The reconciler: finds actions whose outcome never came back and runs that stopped moving, and resolves them."""
