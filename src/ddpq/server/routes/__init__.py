"""The API's routes, one ``APIRouter`` per concern; ``create_app`` includes them in order."""
