"""SwitchSD Studio: the Gradio front end. It consumes the engine's StepEvent stream; it never decodes itself."""
